// DRAGIN's kinds in the report's page, each drawn by its fields: RIND's reading, QFS's query, the continuation and
// the completed answer.

  addMethodViews(() => ({
    [K.RindCheck]: genericStep,
    [K.FocusedQuery]: genericStep,
    [K.Continuation]: genericStep,
    [K.AnswerCompletion]: genericStep,
  }));
