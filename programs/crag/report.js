// CRAG's and Self-CRAG's views in the report's page: the evaluator's scores against the thresholds, the action,
// the refined strips, the knowledge search, and the knowledge forms Self-CRAG gives Self-RAG.

  function scoreBar(value, low, high, marks, color) {
    const span = high - low || 1;
    const at = (x) => `${(100 * (x - low) / span).toFixed(1)}%`;
    return h("div", { class: "bar" },
      h("div", { class: "fill", style: `width:${at(clamp(value, low, high))};background:${color}` }),
      marks.filter(isNumber).map((mark) => h("div", { class: "mark", style: `left:${at(mark)}`, title: `threshold ${mark}` })));
  }

  addMethodViews(() => ({
    [K.Evaluate]: (step, context) => {
      const action = context.action || {};
      const scores = (step.scores || []).map((s) => s.score);
      const low = Math.min(-1, ...scores, ...[action.lower].filter(isNumber));
      const high = Math.max(1, ...scores, ...[action.upper].filter(isNumber));
      return [
        head(step.step, h("span", { class: "muted" }, step.scorer)),
        (step.scores || []).map((s) => h("div", { class: "score-row", title: s.id },
          h("span", {}, s.title || s.id),
          scoreBar(s.score, low, high, [action.lower, action.upper],
            s.score > action.upper ? "#34d399" : s.score < action.lower ? "#f87171" : "#fbbf24"),
          h("span", {}, fmt(s.score)))),
      ];
    },
    [K.Action]: (step) => [
      head(step.step, badge(step.action, { correct: "good", incorrect: "bad", ambiguous: "warn" }[step.action])),
      h("div", { class: "muted" }, `highest score ${fmt(step.max_score)}; thresholds: lower ${step.lower}, ` +
        `upper ${step.upper}`),
    ],
    [K.Refine]: (step) => [
      head(step.step, h("span", { class: "muted" }, `${step.source} · ${step.mode} · ${step.refinement}`)),
      h("div", { class: "muted" }, `kept ${(step.kept || []).length} of ${(step.strip_scores || []).length} strips`),
      (step.kept || []).map((strip) => h("div", { class: "strip" },
        h("span", { class: "metric", style: `background:${metricColor((strip.score + 1) / 2)}` }, fmt(strip.score)),
        strip.text)),
    ],
    [K.Rewrite]: (step) => [head(step.step), query(step.query),
      step.reason ? h("div", { class: "muted" }, step.reason) : null],
    [K.Search]: (step) => [head("knowledge search", step.skipped ? badge("skipped") : null), fields(without(step))],
    [K.Contexts]: (step) => [head(`knowledge forms · depth ${step.depth}`),
      h("div", { class: "muted" }, `given: ${(step.given || []).join(", ") || "none"}; empty: ${(step.empty || []).join(", ") || "none"}`)],
    [K.AnswerFromQuestion]: genericStep,
  }), (trace, context) => {
    context.action = trace.find((step) => step.step === K.Action) || null;
  });
