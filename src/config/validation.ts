import * as v from "valibot";

// What the cluster document and request schemas share: JSON objects (arrays are not objects
// here), enums, and every problem worded as the router has always worded it. The schemas moved
// from zod 3 to valibot for the Worker's size (docs/operations.md, "Bundle size"); the texts, paths and their
// order stayed zod 3's, which operators, scripts and tests already know.

export type Issue = v.BaseIssue<unknown>;
type Entries = v.ObjectEntries;

/** zod 3's name for a value's type, as its messages say it ("received array"). */
function typeName(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  if (typeof value === "number" && Number.isNaN(value)) return "nan";
  return typeof value;
}

const isJsonObject = (value: unknown): value is Record<string, unknown> => typeof value === "object" && value !== null && !Array.isArray(value);
const expectedObject = (issue: Issue) => (issue.input === undefined ? "Required" : `Expected object, received ${typeName(issue.input)}`);
/** A JSON object and nothing else: valibot's own objects accept arrays. */
const jsonObject = v.custom<Record<string, unknown>>(isJsonObject, expectedObject);

/**
 * Only the keys listed; the others are one problem at the object, naming them all, after the
 * problems of its keys (as valibot's strictObject, whose code the Worker need not carry).
 */
export function strictObject<const E extends Entries>(entries: E) {
  return v.pipe(
    jsonObject,
    v.looseObject(entries, "Required"),
    v.rawCheck(({ dataset, addIssue }) => {
      // also when a key's value is wrong (the object is then not "typed"), but not when it is no object
      const unknown = isJsonObject(dataset.value) ? Object.keys(dataset.value).filter((key) => !Object.hasOwn(entries, key)) : [];
      if (unknown.length) addIssue({ message: `Unrecognized key(s) in object: ${unknown.map((key) => `'${key}'`).join(", ")}` });
    }),
  ) as unknown as v.StrictObjectSchema<E, undefined>;
}

/** The keys listed are checked; the others pass through untouched. */
export function looseObject<const E extends Entries>(entries: E) {
  return v.pipe(jsonObject, v.looseObject(entries, "Required"));
}

/** One of a few strings. */
export function oneOf<const T extends readonly [string, ...string[]]>(options: T) {
  const listed = options.map((option) => `'${option}'`).join(" | ");
  return v.picklist(options, (issue) =>
    issue.input === undefined
      ? "Required"
      : typeof issue.input === "string"
        ? `Invalid enum value. Expected ${listed}, received '${issue.input}'`
        : `Expected ${listed}, received ${typeName(issue.input)}`,
  );
}

/**
 * A check on a value its schema accepted, with zod 3's wording unless it names its own message.
 * One valibot rawCheck serves every bound, length and pattern: the Worker carries no
 * integer/minValue/maxLength/regex actions of valibot's (docs/operations.md, "Bundle size"). Like valibot's
 * own actions it runs after an earlier one failed, so every problem of a value is listed, in order.
 */
export const rule = <T>(ok: (value: T) => boolean, message: string | ((value: T) => string)) =>
  v.rawCheck<T>(({ dataset, addIssue }) => {
    if (dataset.typed && !ok(dataset.value)) addIssue({ message: typeof message === "string" ? message : message(dataset.value) });
  });

type Sized = string | unknown[];
const sizeWords = (value: Sized) => (Array.isArray(value) ? ["Array", "element"] : ["String", "character"]);
export const integer = (message = "Expected integer, received float") => rule<number>(Number.isInteger, message);
export const finite = () => rule<number>(Number.isFinite, "Number must be finite");
export const gtValue = (at: number, message = `Number must be greater than ${at}`) => rule<number>((n) => n > at, message);
export const minValue = (at: number, message = `Number must be greater than or equal to ${at}`) => rule<number>((n) => n >= at, message);
export const maxValue = (at: number, message = `Number must be less than or equal to ${at}`) => rule<number>((n) => n <= at, message);
export const minLength = <T extends Sized>(at: number, message?: string) =>
  rule<T>(
    (x) => x.length >= at,
    message ??
      ((x) => {
        const [what, unit] = sizeWords(x);
        return `${what} must contain at least ${at} ${unit}(s)`;
      }),
  );
export const maxLength = <T extends Sized>(at: number) =>
  rule<T>(
    (x) => x.length <= at,
    (x) => {
      const [what, unit] = sizeWords(x);
      return `${what} must contain at most ${at} ${unit}(s)`;
    },
  );
export const regex = (pattern: RegExp, message: string) => rule<string>((s) => pattern.test(s), message);

/** The wording of every problem whose schema names no message of its own. */
function defaultMessage(issue: Issue): string {
  if (issue.type === "union") return "Invalid input";
  if (issue.input === undefined) return "Required";
  return `Expected ${issue.type}, received ${typeName(issue.input)}`;
}

export interface FoundIssue {
  path: (string | number)[];
  message: string;
  /** the value was absent (a required field is missing) */
  missing: boolean;
}

/** Validates; on failure, each problem's path (from the document's root) and message. */
export function check<S extends v.GenericSchema>(schema: S, value: unknown): { ok: true; value: v.InferOutput<S> } | { ok: false; issues: FoundIssue[] } {
  const result = v.safeParse(schema, value, { message: defaultMessage });
  if (result.success) return { ok: true, value: result.output };
  return {
    ok: false,
    issues: result.issues.map((issue) => {
      const path = (issue.path ?? []).map((item) => item.key as string | number);
      return { path, message: issue.message, missing: issue.kind === "schema" && issue.input === undefined };
    }),
  };
}

/** `nodes[1].url`; the empty path is "". */
export function renderPath(path: (string | number)[]): string {
  return path.reduce<string>((out, part) => (typeof part === "number" ? `${out}[${part}]` : out ? `${out}.${part}` : part), "");
}
