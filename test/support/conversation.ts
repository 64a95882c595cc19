/**
 * Multi-turn chat bodies whose system prompt is 6 prefix blocks (~3,100 tokens), so a
 * conversation's turns share whole blocks. `run` (a file's random or seeded suffix) keeps one run's
 * prompts apart from another's; `conversation(name)` returns the body of turn i, its history
 * growing with each call.
 */
export function conversations(run: string): (name: string) => (i: number) => { model: string; max_tokens: number; messages: Array<{ role: string; content: string }> } {
  return (name) => {
    const messages: Array<{ role: string; content: string }> = [{ role: "system", content: `${name} ${run}. `.padEnd(6 * 2048, `${name} rule. `) }];
    return (i) => {
      if (i > 1) messages.push({ role: "assistant", content: `answer ${i - 1}` });
      messages.push({ role: "user", content: `${name} question ${i}` });
      return { model: "sim-model", max_tokens: 2, messages: [...messages] };
    };
  };
}
