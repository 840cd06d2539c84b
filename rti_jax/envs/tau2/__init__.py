"""tau2-bench's Retail and Airline domains (and Telecom, to check our port), run in-process by tau2's own code (the ``tau2`` extra).

One adapter for both domains (``env.name=retail`` / ``env.name=airline``): tau2's tools, database,
policy text and evaluator; a scripted offline user (or tau2's user-simulator prompt answered by a
chat server, ``generation.openai_chat``); tau2's tasks as
the test split and generated tasks as the training split. Importing this package imports nothing
from tau2: ``bridge.tau2_modules()`` does, on first use, and a missing package is an ImportError
that says how to install it. Modules:

* ``bridge``: tau2's domains, tasks, gold replays and rewards (``tau2_reward``, ``fast_reward``);
* ``env``: ``Tau2Env``, the ``Environment``;
* ``user``: ``ScriptedUser`` and ``LLMUser``; ``replay``: a Telecom port episode replayed in ``Tau2Env``;
* ``tasks``: ``Tau2Task`` and request types; ``generate``: the training tasks;
* ``condensed``: short policy texts for tiny policies; ``agents``: gold and do-nothing agents;
* ``rules``: the rule-based Validator and Verifier; ``source``: the ``TaskSource``;
* ``registration``: the registry entries; ``python -m rti_jax.envs.tau2 stats``: the task table.
"""

from __future__ import annotations
