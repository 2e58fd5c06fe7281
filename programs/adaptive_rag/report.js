// Adaptive-RAG's kind in the report's page, drawn by its fields: the complexity label and the strategy chosen.

  addMethodViews(() => ({
    [K.Route]: genericStep,
  }));
