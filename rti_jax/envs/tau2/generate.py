"""Training tasks generated from tau2's own databases, without touching tau2's tasks.

Each generated task recombines a user of the domain's database with one of their orders
(Retail) or reservations (Airline) that no tau2 task mentions, and a request type that the
order's or reservation's state allows under the domain's policy. Its scenario is written here from
templates (second person, as tau2 writes scenarios); its evaluation criteria are programmatic: the
gold calls (identification, look-ups, then at most one write) with tau2's default reward basis
(DB and COMMUNICATE, nothing to communicate). Request types:

* Retail: ``cancel`` / ``modify_items`` / ``modify_address`` / ``modify_payment`` (a pending order),
  ``return`` / ``exchange`` (a delivered order), ``user_address`` (the account's address), and
  ``refusal`` (cancelling an order already processed: the agent must decline).
* Airline: ``baggage`` (add checked bags, extra ones charged as the policy counts them), ``cabin``
  (change the cabin of a reservation none of whose flights has left), ``cancel`` (when the policy
  allows it: booked within 24 hours, business cabin, a flight cancelled by the airline, or insurance
  and a covered reason), ``passengers`` (replace one passenger), and ``refusal`` (a cancellation the
  policy does not allow, or removing a passenger).

Checks: every draft's gold calls are replayed through tau2's environment and a draft with an
error reply (or an identification that finds someone else) is dropped, so every kept task's gold
replay is scored 1.0 by tau2's evaluator (the tests check a sample, ``python -m rti_jax.envs.tau2
stats`` all of them). ``overlap(domain, tasks)`` lists the (user, target, write) keys a task shares
with a tau2 task; generation leaves out every order / reservation / user a tau2 task targets, so it
is empty. Deterministic given the seed; replays are batched (one fresh database per batch of drafts
of different users: no write of one user's draft can change another's).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import re
from typing import Any, Iterable

from rti_jax.envs.tau2 import bridge
from rti_jax.envs.tau2.tasks import Tau2Task

GENERATOR_VERSION = 1
NOW = "2024-05-15T15:00:00"  # the airline policy's current time
_ID_IN_TEXT = re.compile(r"#W\d{7}|\b[a-z]+_[a-z]+_\d{3,5}\b|\b(?=[A-Z0-9]*\d)(?=[A-Z0-9]*[A-Z])[A-Z0-9]{6}\b")
_INSTRUCTIONS = "You want this handled in this conversation. Answer the agent's questions with what you know."


@dataclasses.dataclass
class Draft:
  """A generated task before its check.

  user_id / target: whose request, about which order, reservation or account.
  kind: the request type. actions: the gold calls (name, arguments).
  """

  user_id: str
  target: str
  kind: str
  reason_for_call: str
  known_info: str
  unknown_info: str | None
  actions: list[tuple[str, dict[str, Any]]]


# --------------------------------------------------------------------------- what tau2's tasks use


@functools.cache
def tau2_targets(domain: str) -> frozenset[str]:
  """Every order / reservation / user id any tau2 task of ``domain`` names (gold calls or scenario)."""
  out: set[str] = set()
  for task in bridge.base_tasks(domain):
    for action in (task.evaluation_criteria.actions or []) if task.evaluation_criteria else []:
      for leaf in _string_leaves(action.arguments):
        out.update(_ID_IN_TEXT.findall(leaf))
    out.update(_ID_IN_TEXT.findall(str(task.user_scenario)))
  return frozenset(out)


def _string_leaves(obj: Any) -> Iterable[str]:
  if isinstance(obj, dict):
    for v in obj.values():
      yield from _string_leaves(v)
  elif isinstance(obj, (list, tuple)):
    for v in obj:
      yield from _string_leaves(v)
  elif isinstance(obj, str):
    yield obj


def _owner(domain: str, target: str) -> str:
  dump = bridge._pristine(domain)[1]
  table = dump.get("orders" if domain == "retail" else "reservations", {})
  return table[target]["user_id"] if target in table else target


def task_keys(domain: str, task: Any) -> set[tuple[str, str, str]]:
  """(user, target, write tool or ``none``) of each target a tau2 ``Task``'s gold calls act on."""
  writes = bridge.tool_info(domain)[1]
  actions = (task.evaluation_criteria.actions or []) if task.evaluation_criteria else []
  keys, targets = set(), set()
  for action in actions:
    target = next((action.arguments[k] for k in ("order_id", "reservation_id", "user_id")
                   if isinstance(action.arguments.get(k), str)), None)
    if target is None:
      continue
    if action.name in writes:
      keys.add((_owner(domain, target), target, action.name))
    targets.add(target)
  if not keys:
    keys = {(_owner(domain, t), t, "none") for t in targets}
  return keys


def overlap(domain: str, tasks: Iterable[Tau2Task]) -> set[tuple[str, str, str]]:
  """The (user, target, write) keys ``tasks`` share with tau2's own tasks of ``domain``."""
  test = set().union(*(task_keys(domain, t) for t in bridge.base_tasks(domain)))
  return set().union(*(task_keys(domain, t.task) for t in tasks)) & test


# --------------------------------------------------------------------------- shared wording


def _options(opts: dict[str, Any]) -> str:
  return ", ".join(f"{k} {v}" for k, v in opts.items())


def _address_line(a: dict[str, Any]) -> str:
  return ", ".join(str(a[k]) for k in ("address1", "address2", "city", "state", "country", "zip") if a.get(k))


def _address_args(a: dict[str, Any]) -> dict[str, str]:
  return {k: str(a.get(k, "")) for k in ("address1", "address2", "city", "state", "country", "zip")}


def _payment_words(method: dict[str, Any], methods: dict[str, Any]) -> str:
  """How a user names a payment method of theirs (second person)."""
  source = method.get("source")
  same = [m for m in methods.values() if m.get("source") == source]
  if source == "credit_card":
    return f"your {method.get('brand', '')} credit card ending in {method.get('last_four', '')}".replace("  ", " ")
  if source == "paypal":
    return "your PayPal account"
  if source == "gift_card":
    return "your gift card" if len(same) == 1 else f"your gift card {method['id']}"
  return f"your {str(source).replace('_', ' ')} {method.get('id', '')}".strip()


def _identity(rng: random.Random, user: dict[str, Any]) -> tuple[str, str | None, tuple[str, dict[str, Any]]]:
  """(known info, unknown info, the gold identification call) of a Retail user."""
  first, last = user["name"]["first_name"], user["name"]["last_name"]
  if rng.random() < 0.5:
    return (f"You are {first} {last}. Your email is {user['email']}.", None,
            ("find_user_id_by_email", {"email": user["email"]}))
  return (f"You are {first} {last} and your zip code is {user['address']['zip']}.",
          "You do not remember your email address.",
          ("find_user_id_by_name_zip", {"first_name": first, "last_name": last, "zip": user["address"]["zip"]}))


# --------------------------------------------------------------------------- Retail


def _retail_drafts(dump: dict[str, Any], rng: random.Random, excluded: frozenset[str]) -> list[Draft]:
  users, orders, products = dump["users"], dump["orders"], dump["products"]
  user_ids = sorted(users)
  drafts: list[Draft] = []
  for uid in user_ids:
    if uid in excluded:
      continue
    user = users[uid]
    per_user = 0
    for oid in user.get("orders", []):
      order = orders.get(oid)
      if order is None or oid in excluded or per_user >= 2:
        continue
      known, unknown, ident = _identity(rng, user)
      draft = _retail_order_draft(rng, user, order, products, users)
      if draft is None:
        continue
      kind, reason, writes, reads = draft
      drafts.append(Draft(uid, oid, kind, reason, known, unknown,
                          [ident, ("get_order_details", {"order_id": oid}), *reads, *writes]))
      per_user += 1
    if rng.random() < 0.1:
      other = users[user_ids[rng.randrange(len(user_ids))]]
      if other["address"] != user["address"]:
        known, unknown, ident = _identity(rng, user)
        drafts.append(Draft(uid, uid, "user_address",
                            f"You moved, and you want the default address of your account changed to "
                            f"{_address_line(other['address'])}.", known, unknown,
                            [ident, ("modify_user_address", {"user_id": uid, **_address_args(other["address"])})]))
  return drafts


def _variant_choice(rng: random.Random, item: dict[str, Any], products: dict[str, Any]) -> dict[str, Any] | None:
  """Another available variant of the item's product, preferring one that differs in one option."""
  product = products.get(item["product_id"])
  if product is None:
    return None
  options = [v for v in product["variants"].values() if v["available"] and v["item_id"] != item["item_id"]]
  one = [v for v in options if sum(v["options"].get(k) != x for k, x in item["options"].items()) == 1]
  pool = one or options
  return pool[rng.randrange(len(pool))] if pool else None


def _retail_order_draft(rng: random.Random, user: dict[str, Any], order: dict[str, Any], products: dict[str, Any],
                        users: dict[str, Any]) -> tuple[str, str, list, list] | None:
  """(kind, reason for call, write calls, extra read calls) for one order, or None."""
  oid, status, items = order["order_id"], order["status"], order["items"]
  methods = user["payment_methods"]
  paid = order["payment_history"][0]["payment_method_id"] if order["payment_history"] else None
  if status == "pending":
    kind = ("cancel", "modify_items", "modify_address", "modify_payment")[rng.randrange(4)]
    if kind == "cancel":
      reason = ("no longer needed", "ordered by mistake")[rng.randrange(2)]
      why = "you no longer need it" if reason == "no longer needed" else "you ordered it by mistake"
      names = ", ".join(i["name"] for i in items)
      return (kind, f"You want to cancel your pending order {oid} ({names}) because {why}.",
              [("cancel_pending_order", {"order_id": oid, "reason": reason})], [])
    if kind == "modify_address":
      other = list(users.values())[rng.randrange(len(users))]["address"]
      if other == order["address"]:
        return None
      return (kind, f"You want the shipping address of your pending order {oid} changed to {_address_line(other)}.",
              [("modify_pending_order_address", {"order_id": oid, **_address_args(other)})], [])
    if kind == "modify_payment":
      others = [m for k, m in methods.items() if k != paid]
      if not others or len(order["payment_history"]) != 1:
        return None
      new = others[rng.randrange(len(others))]
      return (kind, f"You want to pay for your pending order {oid} with {_payment_words(new, methods)} instead.",
              [("modify_pending_order_payment", {"order_id": oid, "payment_method_id": new["id"]})], [])
  if status == "pending" or status == "delivered":
    if status == "delivered":
      kind = ("return", "exchange")[rng.randrange(2)]
    if kind == "return":
      chosen = rng.sample(items, min(len(items), 1 + rng.randrange(2)))
      gift = [m for m in methods.values() if m.get("source") == "gift_card"]
      refund = gift[0]["id"] if gift and rng.random() < 0.3 else paid
      if refund is None or refund not in methods:
        return None
      names = " and ".join(f"the {i['name']} ({_options(i['options'])})" for i in chosen)
      return (kind, f"You want to return {names} from your delivered order {oid}, with the refund going to "
                    f"{_payment_words(methods[refund], methods)}.",
              [("return_delivered_order_items", {"order_id": oid, "item_ids": [i["item_id"] for i in chosen],
                                                 "payment_method_id": refund})], [])
    item = items[rng.randrange(len(items))]
    variant = _variant_choice(rng, item, products)
    if variant is None or paid is None or paid not in methods:
      return None
    changed = {k: v for k, v in variant["options"].items() if item["options"].get(k) != v}
    verb, tool = (("exchange", "exchange_delivered_order_items") if kind == "exchange"
                  else ("change", "modify_pending_order_items"))
    state = "delivered" if kind == "exchange" else "pending"
    return (kind, f"You want to {verb} the {item['name']} ({_options(item['options'])}) in your {state} order {oid} "
                  f"for the same product with {_options(changed)}, everything else the same. Any price difference "
                  f"goes to {_payment_words(methods[paid], methods)}.",
            [(tool, {"order_id": oid, "item_ids": [item["item_id"]], "new_item_ids": [variant["item_id"]],
                     "payment_method_id": paid})],
            [("get_product_details", {"product_id": item["product_id"]})])
  if status == "processed" and rng.random() < 0.5:
    return ("refusal", f"You want to cancel your order {oid} because you no longer need it.", [], [])
  return None


# --------------------------------------------------------------------------- Airline

_FREE_BAGS = {"regular": {"basic_economy": 0, "economy": 1, "business": 2},
              "silver": {"basic_economy": 1, "economy": 2, "business": 3},
              "gold": {"basic_economy": 2, "economy": 3, "business": 4}}


def _segment_status(flights: dict[str, Any], segment: dict[str, Any]) -> str:
  return str(flights.get(segment["flight_number"], {}).get("dates", {}).get(segment["date"], {}).get("status", ""))


def _airline_drafts(dump: dict[str, Any], rng: random.Random, excluded: frozenset[str]) -> list[Draft]:
  users, reservations, flights = dump["users"], dump["reservations"], dump["flights"]
  drafts: list[Draft] = []
  for uid in sorted(users):
    if uid in excluded:
      continue
    user = users[uid]
    name = f"{user['name']['first_name']} {user['name']['last_name']}"
    per_user = 0
    for rid in user.get("reservations", []):
      res = reservations.get(rid)
      if res is None or rid in excluded or res.get("status") == "cancelled" or per_user >= 2:
        continue
      statuses = [_segment_status(flights, s) for s in res["flights"]]
      if any(s in ("landed", "flying") for s in statuses) or not statuses:
        continue  # a flown segment: only a human agent can help
      draft = _airline_reservation_draft(rng, user, res, statuses, users)
      if draft is None:
        continue
      kind, reason, writes = draft
      drafts.append(Draft(uid, rid, kind, reason, f"You are {name}. Your user id is {uid}.", None,
                          [("get_user_details", {"user_id": uid}), ("get_reservation_details", {"reservation_id": rid}),
                           *writes]))
      per_user += 1
  return drafts


def _update_payment(rng: random.Random, user: dict[str, Any]) -> dict[str, Any] | None:
  methods = [m for m in user["payment_methods"].values() if m.get("source") in ("credit_card", "gift_card")]
  return methods[rng.randrange(len(methods))] if methods else None


def _airline_reservation_draft(rng: random.Random, user: dict[str, Any], res: dict[str, Any], statuses: list[str],
                               users: dict[str, Any]) -> tuple[str, str, list] | None:
  rid, cabin = res["reservation_id"], res["cabin"]
  trip = f"{res['origin']} to {res['destination']}"
  methods = user["payment_methods"]
  kind = ("baggage", "cabin", "cancel", "passengers")[rng.randrange(4)]
  if kind == "baggage":
    allowance = _FREE_BAGS[user["membership"]][cabin] * len(res["passengers"])
    if res["nonfree_baggages"] != max(0, res["total_baggages"] - allowance):
      return None  # a reservation whose bag counts the policy's rule does not explain
    pay = _update_payment(rng, user)
    if pay is None:
      return None
    add = 1 + rng.randrange(2)
    total = res["total_baggages"] + add
    return ("baggage", f"You want to add {add} checked bag{'s' if add > 1 else ''} to your reservation {rid} "
                       f"({trip}). Any fee goes on {_payment_words(pay, methods)}.",
            [("update_reservation_baggages", {"reservation_id": rid, "total_baggages": total,
                                               "nonfree_baggages": max(0, total - allowance), "payment_id": pay["id"]})])
  if kind == "cabin":
    if any(s != "available" for s in statuses):
      return None
    new = [c for c in ("basic_economy", "economy", "business") if c != cabin][rng.randrange(2)]
    pay = _update_payment(rng, user)
    if pay is None:
      return None
    return ("cabin", f"You want to change the cabin of your reservation {rid} ({trip}) to "
                     f"{new.replace('_', ' ')} for all flights, keeping the same flights. Any price difference goes "
                     f"to or comes from {_payment_words(pay, methods)}.",
            [("update_reservation_flights", {"reservation_id": rid, "cabin": new, "payment_id": pay["id"],
                                              "flights": [{"flight_number": s["flight_number"], "date": s["date"]}
                                                          for s in res["flights"]]})])
  if kind == "cancel":
    covered = res.get("insurance") == "yes" and rng.random() < 0.5
    reason = "a health problem" if covered else "a change of plans"
    allowed = (res.get("created_at", "") >= "2024-05-14T15:00:00" or cabin == "business"
               or "cancelled" in statuses or covered)
    text = f"You want to cancel your reservation {rid} ({trip}) because of {reason}."
    return ("cancel", text, [("cancel_reservation", {"reservation_id": rid})]) if allowed else ("refusal", text, [])
  passengers = res["passengers"]
  if len(passengers) >= 2 and rng.random() < 0.3:
    gone = passengers[-1]
    return ("refusal", f"You want to remove passenger {gone['first_name']} {gone['last_name']} from your reservation "
                       f"{rid} ({trip}).", [])
  others = [p for u in users.values() for p in u.get("saved_passengers", [])[:1]]
  new = others[rng.randrange(len(others))] if others else None
  if new is None or any(p["first_name"] == new["first_name"] and p["last_name"] == new["last_name"] for p in passengers):
    return None
  at = rng.randrange(len(passengers))
  old = passengers[at]
  updated = [dict(p) for p in passengers]
  updated[at] = {"first_name": new["first_name"], "last_name": new["last_name"], "dob": new["dob"]}
  return ("passengers", f"On your reservation {rid} ({trip}), you want to replace the passenger {old['first_name']} "
                        f"{old['last_name']} with {new['first_name']} {new['last_name']}, born {new['dob']}.",
          [("update_reservation_passengers", {"reservation_id": rid, "passengers": updated})])


# --------------------------------------------------------------------------- checking and building


def _check(domain: str, drafts: list[Draft]) -> list[Draft]:
  """The drafts whose gold calls all succeed on a fresh database (identification finds the user)."""
  msg = bridge.tau2_modules()["message"]
  batches: list[list[Draft]] = []
  seen: list[set[str]] = []
  for draft in drafts:  # the k-th draft of each user goes to batch k
    for batch, users in zip(batches, seen):
      if draft.user_id not in users:
        batch.append(draft)
        users.add(draft.user_id)
        break
    else:
      batches.append([draft])
      seen.append({draft.user_id})
  ok: set[int] = set()
  for batch in batches:
    env = bridge.new_environment(domain)
    for draft in batch:
      good = True
      for i, (name, args) in enumerate(draft.actions):
        reply = env.get_response(msg.ToolCall(id=f"check_{i}", name=name, arguments=json.loads(json.dumps(args)),
                                              requestor="assistant"))
        if reply.error or (name.startswith("find_user_id") and reply.content != draft.user_id):
          good = False
          break
      if good:
        ok.add(id(draft))
  return [d for d in drafts if id(d) in ok]


def _task(domain: str, n: int, draft: Draft) -> Any:
  tasks_mod = bridge.tau2_modules()["tasks"]
  return tasks_mod.Task.model_validate({
      "id": f"gen-{n:04d}",
      "description": {"purpose": f"generated ({draft.kind}) from the {domain} database", "relevant_policies": None,
                      "notes": f"rti_jax generator v{GENERATOR_VERSION}"},
      "user_scenario": {"persona": None, "instructions": {
          "domain": domain, "reason_for_call": draft.reason_for_call, "known_info": draft.known_info,
          "unknown_info": draft.unknown_info, "task_instructions": _INSTRUCTIONS}},
      "ticket": None, "initial_state": None,
      "evaluation_criteria": {
          "actions": [{"action_id": f"gen-{n:04d}_{i}", "requestor": "assistant", "name": name, "arguments": args,
                       "info": None, "compare_args": None} for i, (name, args) in enumerate(draft.actions)],
          "env_assertions": None, "communicate_info": [], "nl_assertions": None,
          "reward_basis": ["DB", "COMMUNICATE"]}})


@functools.cache
def _generated(domain: str, seed: int) -> tuple[Tau2Task, ...]:
  rng = random.Random(f"{domain}-{seed}-v{GENERATOR_VERSION}")
  dump = bridge._pristine(domain)[1]
  excluded = tau2_targets(domain)
  drafts = (_retail_drafts if domain == "retail" else _airline_drafts)(dump, rng, excluded)
  kept = _check(domain, drafts)
  rng.shuffle(kept)  # request types and users spread over the list
  return tuple(Tau2Task(domain, f"{domain}-gen-{n:04d}", _task(domain, n, d), origin="generated", failing_calls=())
               for n, d in enumerate(kept))


def generated_tasks(domain: str, n: int | None = None, seed: int = 0) -> list[Tau2Task]:
  """The first ``n`` (all when None) generated training tasks of ``domain`` for ``seed``."""
  bridge.check_domain(domain)
  if n is not None and n < 0:
    raise ValueError(f"n: expected None or an integer >= 0, got {n!r}")
  tasks = list(_generated(domain, int(seed)))
  return tasks if n is None else tasks[:n]
