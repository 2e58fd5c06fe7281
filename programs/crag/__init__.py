"""CRAG and Self-CRAG: `crag.py` is the algorithm; `evaluator.py` grades retrieved passages, `refinement.py` cuts
them into knowledge strips and keeps the relevant ones, `correction.py` turns the grades into an action;
`self_crag.py` puts CRAG's corrective step into Self-RAG; `steps.py` declares their step kinds."""
