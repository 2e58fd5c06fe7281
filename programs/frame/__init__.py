"""The frame every program shares: base class, declared parameters, registry, predictors, sentences, and the
active-generation loop of FLARE and its baselines."""
