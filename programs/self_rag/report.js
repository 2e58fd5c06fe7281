// Self-RAG's views in the report's page: retrieval decisions, critiqued candidates (those on the chosen path
// marked), the beam and the chosen path.

  function critiques(groups) {
    const grid = h("div", { class: "critiques" });
    for (const [group, probs] of Object.entries(groups)) {
      const top = Math.max(...Object.values(probs));
      grid.append(h("span", { class: "muted" }, group), h("span", { class: "labels" },
        Object.entries(probs).map(([label, p]) => h("span", { class: p === top ? "top" : null }, `${label} ${fmt(p)}`))));
    }
    return grid;
  }

  addMethodViews(() => ({
    [K.RetrievalDecision]: (step) => [
      head(`retrieval decision · depth ${step.depth}`, badge(step.decision, step.decision === "retrieve" ? "info" : ""),
        step.parent ? h("span", { class: "muted" }, `after ${step.parent}`) : null),
      isNumber(step.p_retrieve) ? h("div", { class: "muted" },
        `p(retrieve) ${fmt(step.p_retrieve)} ${step.p_retrieve > step.delta ? ">" : "≤"} δ ${step.delta}`) :
        h("div", { class: "muted" }, `mode ${step.mode}`),
      step.probabilities ? critiques({ decision: step.probabilities }) : null,
    ],
    [K.Candidate]: (step, context) => [
      head(`candidate ${step.id}`, h("span", { class: "muted" }, `depth ${step.depth}`),
        context.chosen.has(step.id) ? badge("chosen path", "good") : null,
        context.dropped.has(step.id) ? badge("dropped", "bad") : null,
        step.continued ? badge("continued") : null, step.done ? badge("done") : null),
      step.passage ? h("div", { class: "muted" }, "passage ", h("span", { class: "pid" }, step.passage)) : null,
      textBlock(step.text),
      critiques(step.critiques || {}),
      h("div", { class: "muted" }, `sequence p ${fmt(step.sequence_prob)} · relevance ${fmt(step.relevance)} · ` +
        `support ${fmt(step.support)} · utility ${fmt(step.utility)} → score ${fmt(step.score)}, path ` +
        fmt(step.path_score)),
    ],
    [K.Beam]: (step) => [head(`beam · depth ${step.depth}`),
      h("div", { class: "muted" }, `kept ${(step.kept || []).join(", ") || "none"}; finished ` +
        `${(step.finished || []).join(", ") || "none"}`)],
    [K.Dropped]: (step) => [head(step.step, badge((step.ids || []).join(", "), "bad")), h("div", { class: "muted" }, step.reason)],
    [K.NoEvidence]: (step) => [head(`no evidence · depth ${step.depth}`), h("div", { class: "muted" }, step.reason)],
    [K.Chosen]: (step) => [head("chosen path", badge((step.path || []).join(" → "), "good")),
      h("div", { class: "muted" }, `score ${fmt(step.score)}; passages ${(step.passages || []).map((p) => p || "none").join(", ")}`)],
    [K.ClosedSet]: genericStep,
  }), (trace, context) => {
    const of = (kind, key) => trace.filter((step) => step.step === kind).flatMap((step) => step[key] || []);
    context.chosen = new Set(of(K.Chosen, "path"));
    context.dropped = new Set(of(K.Dropped, "ids"));
    for (const step of trace) {
      if (step.step === K.Candidate && context.chosen.has(step.id)) context.onPath.add(step);
    }
  });
