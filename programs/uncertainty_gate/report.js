// The uncertainty gate's kinds in the report's page, each drawn by its fields: the draft and the gate's decision.

  addMethodViews(() => ({
    [K.Draft]: genericStep,
    [K.Gate]: genericStep,
  }));
