// Search-o1's kinds in the report's page, each drawn by its fields: the reasoning's turns, Reason-in-Documents
// and the back-off.

  addMethodViews(() => ({
    [K.Turn]: genericStep,
    [K.Condense]: genericStep,
    [K.BackOff]: genericStep,
  }));
