// The report's page, part 2: a question's traces, each step drawn by the view of its declared kind. The views of
// the kinds programs share are here; each method's come from the `report.js` beside it (programs/crag/report.js,
// ...), which the page holds after this part and which calls `addMethodViews`.
  // --- traces ----------------------------------------------------------------------------------------------

  // The declared step kinds (class name -> kind), the kinds of answer pieces and the stop reasons' sentences, as
  // arag.trace declares them; set once the page's data is read.
  let K = {};
  let PIECE_KINDS = new Set();
  let STOP_REASONS = {};
  let VIEWS = {};
  const METHODS = [];

  /** A method's views of its own kinds: `views()` gives {kind: view(step, context)} once the declarations are read
   * (`K` is set then); a kind drawn by its fields alone names `genericStep`. `readTrace(trace, context)`, when
   * given, notes in the context what the method's views need from the whole trace before a step is drawn
   * (`context.onPath`: steps to mark as on the chosen path). */
  function addMethodViews(views, readTrace) {
    METHODS.push({ views, readTrace });
  }

  function useDeclarations(declarations) {
    K = declarations.kinds;
    PIECE_KINDS = new Set(declarations.piece_kinds);
    STOP_REASONS = declarations.stop_reasons;
    VIEWS = Object.assign(stepViews(), ...METHODS.map((method) => method.views()));
  }

  function traceContext(trace, run) {
    const context = { params: run.params || {}, onPath: new Set() };
    for (const method of METHODS) if (method.readTrace) method.readTrace(trace, context);
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
      const onPath = context.onPath.has(step);
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

  /** The views of the kinds programs share (arag/trace/steps.py); a method's own come from its report.js. */
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
    [K.Read]: genericStep,
    [K.Generate]: genericStep,
  });
