// A streamed chat completion read to its end with the official client: the
// concatenated content and reasoning deltas, the finish reason and the usage
// chunk (shared by the openai client tests of each model family).
export async function readStream(stream) {
  let content = "", reasoning = "", usage = null, finish = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      content += c.delta.content ?? "";
      reasoning += c.delta.reasoning_content ?? "";
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { content, reasoning, finish, usage };
}
