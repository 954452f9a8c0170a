// sse.js — the text/event-stream parser of the browser client.

/**
 * An incremental parser of text/event-stream (the WHATWG "event stream interpretation"): feed it
 * decoded text as it arrives; it returns what completed. Items: {kind: "event", type, data, id}
 * (id is the last event id so far, "" when none), {kind: "retry", ms}, {kind: "comment", text}.
 */
export class SSEParser {
  constructor() {
    this._buf = "";
    this._sawCR = false;
    this._first = true;
    this._data = "";
    this._hasData = false;
    this._type = "";
    this.lastEventId = "";
  }

  /** @param {string} text @returns {Array<any>} */
  feed(text) {
    const out = [];
    if (this._first && text.length > 0) {
      if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
      this._first = false;
    }
    let i = 0;
    if (this._sawCR && text[0] === "\n") i = 1; // the \n of a \r\n split across chunks
    this._sawCR = false;
    let start = i;
    for (; i < text.length; i++) {
      const c = text[i];
      if (c !== "\n" && c !== "\r") continue;
      this._line(this._buf + text.slice(start, i), out);
      this._buf = "";
      if (c === "\r") {
        if (i + 1 < text.length) {
          if (text[i + 1] === "\n") i++;
        } else {
          this._sawCR = true;
        }
      }
      start = i + 1;
    }
    this._buf += text.slice(start);
    return out;
  }

  _line(line, out) {
    if (line === "") {
      if (this._hasData) {
        out.push({ kind: "event", type: this._type || "message", data: this._data.endsWith("\n") ? this._data.slice(0, -1) : this._data, id: this.lastEventId });
      }
      this._data = "";
      this._hasData = false;
      this._type = "";
      return;
    }
    if (line[0] === ":") {
      out.push({ kind: "comment", text: line.slice(1).replace(/^ /, "") });
      return;
    }
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value[0] === " ") value = value.slice(1);
    switch (field) {
      case "event":
        this._type = value;
        break;
      case "data":
        this._data += value + "\n";
        this._hasData = true;
        break;
      case "id":
        if (!value.includes("\0")) this.lastEventId = value;
        break;
      case "retry":
        if (/^\d+$/.test(value)) out.push({ kind: "retry", ms: Number(value) });
        break;
      default: // ignored, as the standard says
    }
  }
}

/** Parses the data of a stream event as JSON; the raw string when it is not JSON. */
export function parseData(data) {
  try {
    return JSON.parse(data);
  } catch {
    return data;
  }
}
