"""TriviaQA: open questions with answer aliases, read in the project's JSON Lines shape."""

import re

from arag.data.datasets.declaration import Dataset

DATASET = Dataset(name="triviaqa", precedence=70, pattern=re.compile(r"trivia_?qa"), metrics=("match", "em", "f1"))
