// Server-sent events read from a fetch() response body: fetch, not EventSource, because
// EventSource cannot send the Authorization header an API key needs.

/**
 * Calls `onEvent(type, data)` for every event of `response` ("message" when unnamed; `data`
 * is the raw text of its data lines) until the body ends (an aborted fetch rejects).
 */
export async function readEvents(response, onEvent) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let type = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) type = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length > 0) onEvent(type, data.join("\n"));
    }
  }
}
