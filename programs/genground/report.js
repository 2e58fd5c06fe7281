// GenGround's views in the report's page: deductions, grounding batches (the one that found evidence marked), each
// hop's outcome.

  addMethodViews(() => ({
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
  }));
