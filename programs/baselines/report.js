// The baselines' kinds in the report's page, each drawn by its fields: Self-Ask's follow-ups, ReAct's actions and
// what its tools returned.

  addMethodViews(() => ({
    [K.FollowUp]: genericStep,
    [K.Act]: genericStep,
    [K.Observation]: genericStep,
  }));
