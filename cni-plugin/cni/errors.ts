// CNI error results (the CNI specification's section "Error"): well-known codes, printed on stdout
// as the runtime's libcni expects, with a non-zero exit.

export const CNI_ERROR = {
  INCOMPATIBLE_VERSION: 1,
  UNSUPPORTED_FIELD: 2,
  UNKNOWN_CONTAINER: 3,
  INVALID_ENV: 4,
  IO_FAILURE: 5,
  DECODE_FAILURE: 6,
  INVALID_CONFIG: 7,
  TRY_AGAIN_LATER: 11,
  NOT_AVAILABLE: 50,
  /** Plugin-specific (100+): the pod's own annotations ask for something impossible. */
  BAD_POD_ANNOTATION: 100,
  /** Plugin-specific: iptables/ip in the pod netns failed. */
  RULES_FAILED: 101,
  /** Plugin-specific: CHECK found the rules missing or different. */
  RULES_MISMATCH: 102,
} as const;

export class CniError extends Error {
  readonly code: number;
  readonly details: string;
  constructor(code: number, msg: string, details = '') {
    super(msg);
    this.code = code;
    this.details = details;
  }

  toJSON(cniVersion: string): Record<string, unknown> {
    return { cniVersion, code: this.code, msg: this.message, ...(this.details ? { details: this.details } : {}) };
  }
}
