// The report's page, part 1: building elements and showing values (helpers the other two parts use).
  const $ = (selector) => document.querySelector(selector);

  /** An element with attributes (class, style, title, on<event> handlers, ...) and children (nodes or text). */
  function h(tag, attributes, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attributes || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "style") node.style.cssText = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  const isNumber = (value) => typeof value === "number" && Number.isFinite(value);
  const clamp = (value, low, high) => Math.max(low, Math.min(high, value));
  const clamp01 = (value) => clamp(value, 0, 1);

  function fmt(value) {
    if (value === null || value === undefined) return "—";
    if (!isNumber(value)) return String(value);
    if (Number.isInteger(value)) return String(value);
    if (Math.abs(value) >= 100) return value.toFixed(0);
    if (Math.abs(value) > 0 && Math.abs(value) < 0.001) return value.toExponential(1);
    return value.toFixed(3).replace(/0+$/, "").replace(/\.$/, "");
  }

  const metricColor = (value) => `hsl(${Math.round(120 * clamp01(value))}, 70%, 86%)`;
  // A token's shade (or, for runs traced without tokens, a sentence's by its least sure token): the less sure,
  // the redder.
  const doubtShade = (prob) => `rgba(239, 68, 68, ${(0.55 * (1 - clamp01(prob))).toFixed(3)})`;
  const LEGEND_PROBS = [1, 0.8, 0.6, 0.4, 0.2, 0];

  function badge(text, kind, title) {
    return h("span", { class: `badge ${kind || ""}`, title }, text);
  }

  function more(label, content) {
    return h("details", { class: "more" }, h("summary", {}, label), content);
  }

  function textBlock(text, extraClass) {
    const value = text === null || text === undefined ? "" : String(text);
    return h("div", { class: `text ${value.length > 600 ? "long" : ""} ${extraClass || ""}` }, value);
  }

  /** Any value as readable fields: text, numbers, lists, nested objects as JSON. */
  function fields(object) {
    const list = h("dl", { class: "fields" });
    for (const [key, value] of Object.entries(object)) {
      let shown;
      if (value === null || typeof value !== "object") shown = textBlock(isNumber(value) ? fmt(value) : value);
      else if (Array.isArray(value) && value.every((item) => item === null || typeof item !== "object")) {
        shown = textBlock(value.map((item) => (isNumber(item) ? fmt(item) : item)).join(" · "));
      } else {
        const json = JSON.stringify(value, null, 1);
        shown = json.length > 300 ? more(`${json.length} characters`, h("pre", {}, json)) : h("pre", {}, json);
      }
      list.append(h("dt", {}, key), h("dd", {}, shown));
    }
    return list;
  }

  function without(step, ...keys) {
    const rest = { ...step };
    for (const key of ["step", ...keys]) delete rest[key];
    return rest;
  }
