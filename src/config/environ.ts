// The process's environment and arguments as ControlZ shows them, with secrets masked. Lives in
// src/config/ because this is where the agent reads process.env.

/** Names that hold secrets: their values are never shown. */
export const SECRET_NAME = /TOKEN|SECRET|PASSWORD|KEY|CERT/i;
export const MASK = '******';

export function maskedEnvironment(env: NodeJS.ProcessEnv = process.env): Record<string, string> {
  return Object.fromEntries(
    Object.keys(env)
      .sort()
      .map((k) => [k, SECRET_NAME.test(k) ? MASK : (env[k] ?? '')]),
  );
}

/** argv with the value of any flag whose name looks secret masked (`--x-token=v` and `--x-token v`). */
export function maskedArgs(argv: readonly string[] = process.argv): string[] {
  const out: string[] = [];
  let maskNext = false;
  for (const arg of argv) {
    if (maskNext && !arg.startsWith('-')) {
      out.push(MASK);
      maskNext = false;
      continue;
    }
    maskNext = false;
    const m = /^(--?[^=]+)=(.*)$/s.exec(arg);
    if (m && SECRET_NAME.test(m[1] ?? '')) out.push(`${m[1]}=${MASK}`);
    else {
      if (arg.startsWith('-') && SECRET_NAME.test(arg)) maskNext = true;
      out.push(arg);
    }
  }
  return out;
}
