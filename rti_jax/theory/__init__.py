"""Small, exactly analysable models of RTI: the Theorem-1 check and the tabular RTI model.

``theorem``: a numerical check of Theorem 1 (Appendix B, Eq. 8-23) on a smooth non-convex
softmax-bandit objective with known L, sigma and J*.
``tabular``: a tabular softmax policy over action sequences trained with GRPO / RTI (Eq. 1-7)
in seconds, with an oracle (optionally leaking) corrector, a Verifier and the PPL gate.
"""
