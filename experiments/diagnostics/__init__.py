"""Diagnostics of the tiny Navigation policy, each reachable as ``run.py --exp=NAME``.

* ``decision_probe``: per RL iteration, the teacher-forced probability of the decisive step and of
  its counterparts (also the builder's decision check, ``DecisionProbe``).
* ``name_copy_check``: does a policy copy place names and coordinates (teacher-forced argmax; also
  the builder's reading check, ``measure_model``).
* ``name_drill``: can a fresh tiny model learn to read stop names out of a request (the bench
  behind the build's stage 0 and its init).
"""
