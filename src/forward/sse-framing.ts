// The framing step of the SSE reader (sse-reader.ts): bytes into lines and fields, per the WHATWG
// SSE spec (https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation).
// It keeps only where it is in a line; what the lines mean is the reader's.

/** A line's field, as far as the reader cares. */
export type Field = "data" | "event" | "other";

const LF = 0x0a;
const CR = 0x0d;
const COLON = 0x3a;

/** What the framing tells its reader as it reads a chunk; positions are indexes into that chunk. */
export interface FrameSink {
  /** a line (not a blank one) begins at `at` */
  lineStart(at: number): void;
  /** the line's field, once its name is read (up to its colon; "other" past 5 characters or for a comment) */
  field(f: Field): void;
  /** the line's value bytes in [from, to) (never a line break): returns where it read up to (to stop there), or -1 to stop reading */
  value(bytes: Uint8Array, from: number, to: number): number;
  /** the line ended at `at` (its line break); `unnamed`: the field of a line that ended before its colon (its value is empty) */
  lineEnd(at: number, unnamed: Field | null): void;
  /** a blank line at `at`: the event ends */
  blank(at: number): void;
}

export interface SseFraming {
  /** Reads a chunk, telling the sink what it finds. */
  feed(bytes: Uint8Array): void;
  /** The stream ended: the field of a last line that ended before its colon, if there is one. */
  end(): Field | null;
}

/**
 * The framing step (WHATWG SSE): lines end in LF, CR or CRLF (a CRLF split between chunks is one
 * line break), a line's field is its name up to the first colon, a blank line ends an event.
 * Only "data" and "event" matter here; any other name (or a comment, `:...`) is "other". Values
 * are handed over as ranges of the chunk, found with `indexOf`, never copied.
 */
export function sseFraming(sink: FrameSink): SseFraming {
  let afterCR = false;
  let lineBytes = 0;
  let field: Field | null = null;
  let name = "";
  const fieldIs = (f: Field) => {
    field = f;
    sink.field(f);
  };
  return {
    feed(bytes) {
      const n = bytes.length;
      /** where the next CR is (n: none): looked up once a feed, not once a line */
      let cr = -1;
      let i = 0;
      while (i < n) {
        const b = bytes[i]!;
        if (b === LF || b === CR) {
          if (b === CR || !afterCR) {
            if (lineBytes) {
              sink.lineEnd(i, field === null ? fieldOf(name) : null);
              lineBytes = 0;
              field = null;
              name = "";
            } else sink.blank(i);
          }
          afterCR = b === CR;
          i++;
          continue;
        }
        afterCR = false;
        if (!lineBytes) sink.lineStart(i);
        if (field === null) {
          // the field's name, up to its colon: "data" and "event" are all we look for
          lineBytes++;
          i++;
          if (b === COLON) fieldIs(lineBytes === 1 ? "other" : fieldOf(name));
          else {
            name += String.fromCharCode(b);
            if (name.length > 5) fieldIs("other");
          }
          continue;
        }
        if (cr < i) cr = indexOrEnd(bytes, CR, i);
        const to = sink.value(bytes, i, Math.min(indexOrEnd(bytes, LF, i), cr));
        if (to < 0) return;
        lineBytes += to - i;
        i = to;
      }
    },
    end: () => (lineBytes && field === null ? fieldOf(name) : null),
  };
}

function fieldOf(name: string): Field {
  return name === "data" || name === "event" ? name : "other";
}

function indexOrEnd(bytes: Uint8Array, b: number, from: number): number {
  const at = bytes.indexOf(b, from);
  return at < 0 ? bytes.length : at;
}
