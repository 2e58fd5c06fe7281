"""PubMedQA: yes/no/maybe questions on an abstract, read in the project's JSON Lines shape (`meta.label_set`)."""

import re

from arag.data.datasets.declaration import Dataset

DATASET = Dataset(name="pubmedqa", precedence=90, pattern=re.compile(r"pubmed_?qa"), metrics=("yes_no_acc",),
                  meta_keys=("label_set",))
