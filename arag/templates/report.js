// The report's page, part 3: reads the embedded runs, sorts the runs' table, draws the scatter with plotly, lists the
// questions and draws a question's traces when it is first opened.
  // --- data ------------------------------------------------------------------------------------------------

  async function loadData() {
    if (typeof DecompressionStream === "undefined") {
      throw new Error("this browser cannot decompress the report's data (DecompressionStream); open it in a " +
                      "current Chrome, Firefox, Safari or Edge");
    }
    const binary = atob(document.getElementById("report-data").textContent.trim());
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return JSON.parse(await new Response(stream).text());
  }

  // --- the runs' table -------------------------------------------------------------------------------------

  function compareValues(a, b) {
    const x = parseFloat(a);
    const y = parseFloat(b);
    const xNumber = a !== "" && !Number.isNaN(x);
    const yNumber = b !== "" && !Number.isNaN(y);
    if (xNumber && yNumber) return x - y;
    if (xNumber !== yNumber) return xNumber ? -1 : 1;
    return String(a).localeCompare(String(b));
  }

  function makeSortable(table) {
    const headers = [...table.tHead.rows[0].cells];
    headers.forEach((header, column) => header.addEventListener("click", () => {
      const direction = header.dataset.sort === "asc" ? "desc" : "asc";
      headers.forEach((other) => delete other.dataset.sort);
      header.dataset.sort = direction;
      const sign = direction === "asc" ? 1 : -1;
      const body = table.tBodies[0];
      const rows = [...body.rows];
      rows.sort((r1, r2) => sign * compareValues(r1.cells[column].dataset.value, r2.cells[column].dataset.value));
      body.append(...rows);
    }));
  }

  // --- the scatter -----------------------------------------------------------------------------------------

  function setupScatter(data) {
    const quality = $("#quality");
    const cost = $("#cost");
    if (!quality) {
      $("#scatter").replaceWith(h("p", { class: "muted" }, "The runs have no metrics to plot."));
      return;
    }
    const draw = () => {
      const figure = data.figures[quality.value][cost.value];
      Plotly.react("scatter", figure.data, figure.layout, { displaylogo: false, responsive: true });
      const front = data.fronts[quality.value][cost.value];
      $("#front").textContent = `On the Pareto front (no other run has at least its ${quality.value} for at most ` +
        `its cost, and better in one): ${front.join(", ")}.`;
    };
    quality.addEventListener("change", draw);
    cost.addEventListener("change", draw);
    draw();
  }

  // --- the question list -----------------------------------------------------------------------------------

  function metricChips(metrics) {
    return Object.entries(metrics || {}).map(([name, value]) =>
      h("span", { class: "metric", style: `background:${metricColor(value)}` }, `${name} ${fmt(value)}`));
  }

  function answerChip(run, row) {
    if (!row) return h("span", { class: "chip missing", title: "this run does not hold the question" }, `${run.run}: —`);
    if (row.error) return h("span", { class: "chip failed", title: row.error }, `${run.run}: ✗ ${row.error_kind}`);
    const values = Object.values(row.metrics);
    const best = values.length ? Math.max(...values) : 0;
    const scores = Object.entries(row.metrics).map(([name, value]) => `${name} ${fmt(value)}`).join(" ");
    return h("span", { class: "chip", style: `background:${metricColor(best)}`, title: `${row.prediction}\n${scores}` },
      h("b", {}, run.run), ` ${scores} · ${row.prediction}`);
  }

  function questionEntry(data, question, index) {
    const flags = [
      question.disagree ? badge("runs disagree", "warn") : null,
      question.failed ? badge("failed", "bad") : null,
      question.in_every_run ? null : badge("not in every run", "info"),
    ];
    const summary = h("summary", {},
      h("div", {}, h("span", { class: "q-number" }, `#${index + 1}`), h("span", { class: "q-text" }, question.question),
        flags),
      h("div", { class: "q-gold" }, h("span", { class: "pid" }, question.id), "  gold: ",
        h("b", {}, question.answers.join(" | ") || "—")),
      h("div", { class: "chips" }, question.rows.map((row, i) => answerChip(data.runs[i], row))));
    const entry = h("details", { class: "question", "data-index": index }, summary);
    entry.addEventListener("toggle", () => {
      if (entry.open && entry.children.length === 1) entry.append(questionBody(data, question));
    });
    return entry;
  }

  function questionBody(data, question) {
    const columns = question.rows.length;
    return h("div", { class: "runs-grid", style: `grid-template-columns: repeat(${columns}, minmax(340px, 1fr))` },
      question.rows.map((row, i) => runColumn(data.runs[i], row)));
  }

  function runColumn(run, row) {
    const column = h("div", { class: "run-column" }, h("h4", {}, run.run, " ", h("span", { class: "muted" }, run.program)));
    if (!row) {
      column.append(h("p", { class: "muted" }, "This run does not hold this question."));
      return column;
    }
    column.append(h("div", { class: "answer-box" },
      h("div", { class: "answer" }, row.error ? h("span", { class: "error" }, "failed") : row.prediction),
      metricChips(row.metrics)));
    column.append(h("div", { class: "costs" },
      `${row.lm_calls} LM calls · ${row.prompt_tokens} + ${row.completion_tokens} tokens · ` +
      `${row.retrieval_calls} retrievals · ${row.distinct_passages} passages · ${fmt(row.seconds)} s` +
      (row.attempt ? ` · attempt ${row.attempt + 1}` : "")));
    if (row.error) {
      column.append(h("div", { class: "error-box" },
        h("b", {}, row.error_kind), row.error_step ? ` in ${row.error_step}` : "",
        h("pre", {}, row.error),
        h("div", { class: "muted" }, row.trace.length ? "The steps taken before the failure:" : "No step was recorded before it.")));
    }
    if (row.outputs && Object.keys(row.outputs).length) column.append(more("other outputs", fields(row.outputs)));
    if (row.trace.length || !row.error) column.append(traceView(row.trace, run));
    return column;
  }

  // --- filters -----------------------------------------------------------------------------------------------

  function setupQuestions(data) {
    const list = $("#question-list");
    const entries = data.questions.map((question, index) => questionEntry(data, question, index));
    list.replaceChildren(...entries);
    const haystacks = data.questions.map((q) => [q.id, q.question, ...q.answers,
      ...q.rows.map((row) => (row ? String(row.prediction) : ""))].join("\n").toLowerCase());
    const controls = ["#f-disagree", "#f-failed", "#f-partial", "#f-metric", "#f-below", "#f-run", "#f-text"]
      .map((selector) => $(selector)).filter(Boolean);

    const metricMatches = (question) => {
      const below = $("#f-below") ? parseFloat($("#f-below").value) : NaN;
      if (Number.isNaN(below)) return true;
      const metric = $("#f-metric").value;
      const which = $("#f-run").value;
      const isBelow = (row) => row && isNumber(row.metrics[metric]) && row.metrics[metric] < below;
      const present = question.rows.filter(Boolean);
      if (which === "any") return present.some(isBelow);
      if (which === "all") return present.length > 0 && present.every(isBelow);
      return isBelow(question.rows[Number(which)]);
    };

    const apply = () => {
      const checked = (selector) => Boolean($(selector) && $(selector).checked);
      const text = $("#f-text").value.trim().toLowerCase();
      let shown = 0;
      data.questions.forEach((question, index) => {
        const visible = (!checked("#f-disagree") || question.disagree) && (!checked("#f-failed") || question.failed) &&
          (!checked("#f-partial") || !question.in_every_run) && (!text || haystacks[index].includes(text)) &&
          metricMatches(question);
        entries[index].hidden = !visible;
        shown += visible;
      });
      $("#shown-count").textContent = `${shown} of ${data.questions.length} questions shown`;
    };
    controls.forEach((control) => control.addEventListener("input", apply));
    apply();
  }

  document.querySelectorAll("table.sortable").forEach(makeSortable);
  loadData().then((data) => {
    useDeclarations(data.declarations);
    setupScatter(data);
    setupQuestions(data);
    document.body.dataset.ready = "true";
  }).catch((error) => {
    const message = $("#load-error");
    message.hidden = false;
    message.textContent = `The report could not be drawn: ${error.message || error}`;
    console.error(error);
  });
