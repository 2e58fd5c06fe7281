// Adaptive-Note's views in the report's page: the notes as they changed (each with the reviewer's verdict), the
// proposed queries, the reviewer's decisions.

  addMethodViews(() => ({
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
  }), (trace, context) => {
    const reviews = trace.filter((step) => step.step === K.Review);
    context.reviews = Object.fromEntries(reviews.map((step) => [step.iteration, step]));
  });
