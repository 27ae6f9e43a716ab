// What the plugin checks of parsed JSON (its stdin config, prevResult, the orchconfig).

export const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
