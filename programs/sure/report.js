// SuRe's kinds in the report's page, each drawn by its fields: the candidates, their summaries, validity and
// pair-wise comparisons, and the choice.

  addMethodViews(() => ({
    [K.Candidates]: genericStep,
    [K.Summary]: genericStep,
    [K.Validity]: genericStep,
    [K.Pair]: genericStep,
    [K.Compare]: genericStep,
    [K.Select]: genericStep,
  }));
