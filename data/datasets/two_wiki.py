"""2WikiMultihopQA: HotpotQA's shape, told apart by its `evidences` (or by "2wiki" in the file name)."""

from __future__ import annotations

import re
from pathlib import Path

from arag.data.datasets.declaration import Dataset
from arag.data.datasets.hotpotqa import has_multihop_context, multihop_context_format


def _detect(path: Path, record: dict) -> bool:
    return has_multihop_context(record) and ("evidences" in record or "2wiki" in path.name.lower())


DATASET = Dataset(name="2wiki", precedence=10, pattern=re.compile(r"2wiki"), metrics=("em", "f1"),
                  formats=(multihop_context_format("2wiki", _detect),))
