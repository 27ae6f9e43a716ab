// The text of a Kubernetes Status object (the body of an API error answer), as both the agent's
// API client and the plugin's pod GET put it into their errors. Only the Status's own fields are
// said, never the answer's text: a body that is not a Status (a proxy's page, a TokenRequest cut
// short) may hold anything, a token too, and these errors reach /readyz and pod events.

/** "reason: message" of a Kubernetes Status object, or ''. */
export function statusText(status: { reason?: unknown; message?: unknown }): string {
  return [status.reason, status.message].filter((x) => typeof x === 'string' && x !== '').join(': ');
}

/** The "reason: message" of an answer body that is a Status, or ''. */
export function statusMessage(body: string): string {
  try {
    const status: unknown = JSON.parse(body);
    return typeof status === 'object' && status !== null ? statusText(status) : '';
  } catch {
    return '';
  }
}
