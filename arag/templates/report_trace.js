// The report's page, part 2: a question's traces, each step drawn by the view of its declared kind.
  // --- traces ----------------------------------------------------------------------------------------------

  // The declared step kinds (class name -> kind), the kinds of answer pieces and the stop reasons' sentences, as
  // arag.trace declares them; set once the page's data is read.
  let K = {};
  let PIECE_KINDS = new Set();
  let STOP_REASONS = {};
  let VIEWS = {};

  function useDeclarations(declarations) {
    K = declarations.kinds;
    PIECE_KINDS = new Set(declarations.piece_kinds);
    STOP_REASONS = declarations.stop_reasons;
    VIEWS = stepViews();
  }

  function traceContext(trace, run) {
    const context = { params: run.params || {}, chosen: new Set(), dropped: new Set(), reviews: {}, action: null };
    for (const step of trace) {
      if (step.step === K.Chosen) (step.path || []).forEach((id) => context.chosen.add(id));
      if (step.step === K.Dropped) (step.ids || []).forEach((id) => context.dropped.add(id));
      if (step.step === K.Review) context.reviews[step.iteration] = step;
      if (step.step === K.Action && !context.action) context.action = step;
    }
    return context;
  }

  function traceView(trace, run) {
    const box = h("div", { class: "trace" });
    if (!trace.length) return h("p", { class: "muted" }, "No steps recorded.");
    const context = traceContext(trace, run);
    const written = writtenAnswer(trace, context);
    if (written) box.append(written);
    box.append(h("ol", { class: "steps" }, trace.map((step) => {
      const view = VIEWS[step.step] || genericStep;
      const onPath = step.step === K.Candidate && context.chosen.has(step.id);
      return h("li", { class: `step step-${step.step}${onPath ? " on-path" : ""}` }, view(step, context));
    })));
    return box;
  }

  /** The tokens of the piece a step kept: its own `tokens`, or a kept FLARE look-ahead's; null for runs traced
   * without tokens. */
  function keptTokens(step) {
    if (Array.isArray(step.tokens)) return step.tokens;
    if (Array.isArray(step.lookahead_tokens) && step.lookahead === step.text) return step.lookahead_tokens;
    return null;
  }

  /** `text` drawn token by token, each token shaded by its probability, which its title gives; null when the
   * tokens do not spell the text. A token's leading space is left unshaded. */
  function tokenSpans(text, tokens) {
    if (!Array.isArray(tokens) || !tokens.length || !tokens.every(Array.isArray) || !text) return null;
    const joined = tokens.map((token) => String(token[0])).join("");
    const start = joined.indexOf(text);
    if (start < 0) return null;
    const end = start + text.length;
    const spans = [];
    let at = 0;
    for (const [token, prob] of tokens) {
      const from = at;
      at += String(token).length;
      const shown = joined.slice(Math.max(from, start), Math.min(at, end));
      if (!shown) continue;
      const word = shown.trimStart();
      if (word.length < shown.length) spans.push(shown.slice(0, shown.length - word.length));
      if (!word) continue;
      spans.push(h("span", {
        class: "token", "data-p": prob, title: `${JSON.stringify(String(token))} p = ${fmt(prob)}`,
        style: isNumber(prob) ? `background:${doubtShade(prob)}` : null,
      }, word));
    }
    return spans;
  }

  function legend() {
    return h("span", { class: "legend", title: "token probability: the lighter, the surer" }, "token p",
      LEGEND_PROBS.map((p) => h("span", { class: "swatch", style: `background:${doubtShade(p)}` }, fmt(p))));
  }

  /** The long answer of a program that writes piece by piece, with its retrievals marked: each token shaded by its
   * probability, or, for runs traced without tokens, each piece by its draft's least sure token (when the piece is
   * that draft). */
  function writtenAnswer(trace, context) {
    const pieces = trace.filter((step) => PIECE_KINDS.has(step.step) || step.step === K.Write);
    if (!pieces.length) return null;
    const theta = context.params.theta;
    const drawn = pieces.map((piece) => tokenSpans(piece.text, keptTokens(piece)));
    const byToken = drawn.some(Boolean);
    const drafted = pieces.some((piece) => piece.lookahead !== undefined);
    const atTheta = isNumber(theta) ? ` (retrieval when a draft's token has p ≤ θ = ${theta})` : "";
    let caption = "the answer as written";
    if (byToken) {
      caption += `, each token shaded by its probability (hover for it)${atTheta}` +
        (drafted ? "; a sentence written again shows the rewrite's tokens" : "");
    } else if (pieces.some((piece) => isNumber(piece.min_prob))) {
      caption += `, shaded by the least sure token of each sentence's draft${atTheta}`;
    }
    const paragraph = h("div", { class: "written" },
      h("span", { class: "caption" }, caption, byToken ? legend() : null));
    pieces.forEach((piece, i) => {
      if (piece.retrieved) paragraph.append(searchMark(piece.queries || []));
      const shaded = !drawn[i] && isNumber(piece.min_prob) &&
        (piece.lookahead === undefined || piece.lookahead === piece.text);
      // FLARE writes a sentence again whenever it retrieves, unless the rewrite came out empty
      const rewritten = piece.lookahead !== undefined && piece.retrieved && piece.rewrite !== "empty";
      paragraph.append(h("span", {
        class: drawn[i] ? "piece by-token" : "piece",
        style: shaded ? `background:${doubtShade(piece.min_prob)}` : null,
        title: `${piece.step} ${piece.index + 1}` + (isNumber(piece.min_prob) ? ` · least sure token of the draft: ` +
          `p = ${fmt(piece.min_prob)}` + (rewritten ? " (the draft was rewritten after retrieval)" : "") : ""),
      }, drawn[i] || piece.text), " ");
      if (piece.step === K.Write && piece.search) paragraph.append(searchMark([piece.search]));
    });
    return paragraph;
  }

  function searchMark(queries) {
    return h("span", { class: "search-mark", title: `retrieval with: ${queries.join(" | ")}` }, "search");
  }

  function query(text, label) {
    return h("div", { class: "query" }, h("span", { class: "label" }, label || "query"), " ", text);
  }

  function head(name, ...extra) {
    return h("div", { class: "step-head" }, h("span", { class: "step-name" }, name), extra);
  }

  function passages(list, newIds) {
    const fresh = new Set(newIds || []);
    const count = (list || []).length;
    const label = `${count} passage${count === 1 ? "" : "s"}` + (newIds ? `, ${fresh.size} new` : "");
    return more(label, h("ol", { class: "passages" }, (list || []).map((p) =>
      h("li", { class: fresh.has(p.id) ? "new" : null }, p.title || "", " ", h("span", { class: "pid" }, p.id),
        isNumber(p.score) ? h("span", { class: "muted" }, ` ${fmt(p.score)}`) : null))));
  }

  function probability(label, value, threshold) {
    if (!isNumber(value)) return null;
    const low = isNumber(threshold) && value <= threshold;
    return badge(`${label} ${fmt(value)}`, low ? "bad" : "", low ? `at or below θ = ${threshold}` : null);
  }

  function scoreBar(value, low, high, marks, color) {
    const span = high - low || 1;
    const at = (x) => `${(100 * (x - low) / span).toFixed(1)}%`;
    return h("div", { class: "bar" },
      h("div", { class: "fill", style: `width:${at(clamp(value, low, high))};background:${color}` }),
      marks.filter(isNumber).map((mark) => h("div", { class: "mark", style: `left:${at(mark)}`, title: `threshold ${mark}` })));
  }

  function genericStep(step) {
    return [head(step.step), fields(without(step))];
  }

  function pieceStep(step, context) {
    const rewritten = step.lookahead !== undefined && (step.lookahead !== step.text || Array.isArray(step.tokens));
    const draft = tokenSpans(step.lookahead, step.lookahead_tokens);
    const kept = tokenSpans(step.text, keptTokens(step));
    return [
      head(`${step.step} ${step.index + 1}`, step.retrieved ? badge("retrieved", "info") : null,
        probability("least sure token", step.min_prob, context.params.theta)),
      rewritten ? h("div", { class: "muted" }, "draft: ", draft ? h("span", { class: "piece by-token" }, draft) :
        h("span", { class: "piece", style: `background:${doubtShade(step.min_prob)}` }, step.lookahead)) : null,
      (step.spans || []).length ? h("div", { class: "muted" }, `unsure spans: ${step.spans.join(" | ")}`) : null,
      (step.queries || []).map((text) => query(text)),
      (step.dropped_questions || []).length ? h("div", { class: "muted" },
        `dropped questions (no "?"): ${step.dropped_questions.join(" | ")}`) : null,
      step.rewrite === "empty" ? h("div", { class: "muted" }, "the rewrite came out empty: the draft stands") : null,
      rewritten ? h("div", {}, "written: ", kept ? h("span", { class: "piece by-token" }, kept) : step.text) :
        kept ? h("div", { class: "text" }, h("span", { class: "piece by-token" }, kept)) : textBlock(step.text),
    ];
  }

  /** The view of each declared kind that is drawn otherwise than as its fields. */
  const stepViews = () => ({
    [K.Retrieve]: (step) => [
      head(step.step, h("span", { class: "muted" }, `${step.why || ""} · k=${step.k}`)),
      query(step.query),
      passages(step.passages, step.new_ids),
    ],
    ...Object.fromEntries([...PIECE_KINDS].map((kind) => [kind, pieceStep])),
    [K.Write]: (step) => [
      head(`write ${step.index + 1}`, step.search ? badge("search", "info") : null),
      textBlock(step.text),
      step.search ? query(step.search, "search") : null,
      step.forbidden ? h("div", { class: "muted" }, `forbidden tokens: ${step.forbidden.join(", ")}`) : null,
    ],
    [K.Stop]: (step) => [
      head(step.step, step.reason),
      STOP_REASONS[step.reason] ? h("div", { class: "muted" }, STOP_REASONS[step.reason]) : null,
      fields(without(step, "reason")),
    ],
    [K.Answer]: (step) => [
      head(step.step, probability("least sure token", step.min_token_prob),
        probability("mean token p", step.mean_token_prob)),
      textBlock(step.answer),
      step.stated !== undefined ? h("div", { class: "muted" }, `stated: ${step.stated}`) : null,
    ],
    [K.Unreadable]: (step) => [head("unreadable output", badge("fallback", "bad")), fields(without(step))],

    // CRAG (and Self-CRAG): the evaluator's scores, the action, the refined strips, the knowledge search.
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

    // Self-RAG: retrieval decisions, critiqued candidates, the beam and the chosen path.
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
    [K.Contexts]: (step) => [head(`knowledge forms · depth ${step.depth}`),
      h("div", { class: "muted" }, `given: ${(step.given || []).join(", ") || "none"}; empty: ${(step.empty || []).join(", ") || "none"}`)],

    // Adaptive-Note: the notes as they changed, the proposed queries, the reviewer's decisions.
    [K.Note]: (step, context) => {
      const review = context.reviews[step.iteration];
      const verdict = step.iteration === 0 ? badge("first note", "info") : !review ? null :
        review.better ? badge("better: the new best note", "good") : badge("not better: the best note stays", "bad");
      return [
        head(`note ${step.iteration}`, verdict, review && isNumber(review.p_better) ? badge(`p(better) ${fmt(review.p_better)}`) : null),
        step.query ? query(step.query) : null,
        h("div", { class: "muted" }, `${(step.new_ids || []).length} new passages` +
          ((step.seen_ids || []).length ? `, ${step.seen_ids.length} already read` : "")),
        textBlock(step.note),
      ];
    },
    [K.Query]: (step) => [head(`query · iteration ${step.iteration}`, step.repeated ? badge("repeats an asked query", "bad") : null),
      query(step.query)],
    [K.Review]: (step) => [head(`review · note ${step.iteration}`,
      step.better ? badge("better", "good") : badge("not better", "bad"),
      isNumber(step.p_better) ? badge(`p(better) ${fmt(step.p_better)}`) : null)],

    // GenGround: deductions, grounding batches (the one that found evidence marked), each hop's outcome.
    [K.Deduce]: (step) => [
      head(`deduce · hop ${step.hop}`, step.finished ? badge("final answer", "good") : null),
      step.sub_question ? query(step.sub_question, "sub-question") : null,
      h("div", {}, "deduced answer: ", h("b", {}, step.answer)),
      step.reasoning ? more("reasoning", textBlock(step.reasoning)) : null,
    ],
    [K.Ground]: (step) => {
      const outputs = step.outputs || {};
      return [
        head(`ground · hop ${step.hop} · batch ${step.batch}`,
          step.evidence_found ? badge("evidence found", "good") : badge("no evidence", "")),
        h("div", { class: "muted" }, "passages ", (step.passage_ids || []).map((id) => h("span", { class: "pid" }, `${id} `))),
        (Array.isArray(outputs.evidence) ? outputs.evidence : []).map((quote) => h("div", { class: "strip" }, quote)),
        outputs.revised_answer !== undefined ? h("div", {}, "revised answer: ", h("b", {}, outputs.revised_answer)) : null,
        Object.keys(without(outputs, "evidence", "revised_answer")).length ?
          more("other outputs", fields(without(outputs, "evidence", "revised_answer"))) : null,
        step.inputs && step.inputs.passages ? more("the batch's passages", textBlock([].concat(step.inputs.passages).join("\n"))) : null,
      ];
    },
    [K.Hop]: (step) => [
      head(`hop ${step.hop}`, step.revised ? badge("revised by grounding", "info") : null),
      query(step.sub_question, "sub-question"),
      h("div", {}, "answer: ", step.revised ? `${step.deduced_answer} (deduced) → ` : "", h("b", {}, step.answer)),
      h("div", { class: "muted" }, `${(step.batches || []).length} batch(es) tried; ${(step.evidence || []).length} evidence quote(s)`),
    ],
  });

  function critiques(groups) {
    const grid = h("div", { class: "critiques" });
    for (const [group, probs] of Object.entries(groups)) {
      const top = Math.max(...Object.values(probs));
      grid.append(h("span", { class: "muted" }, group), h("span", { class: "labels" },
        Object.entries(probs).map(([label, p]) => h("span", { class: p === top ? "top" : null }, `${label} ${fmt(p)}`))));
    }
    return grid;
  }
