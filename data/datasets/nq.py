"""Natural Questions (NQ-open): open questions with short answers, read in the project's JSON Lines shape."""

import re

from arag.data.datasets.declaration import Dataset

DATASET = Dataset(name="nq", precedence=80,
                  pattern=re.compile(r"nq[_-]open|natural[_ -]questions|(?<![a-z])nq(?![a-z])"),
                  metrics=("match", "em", "f1"))
