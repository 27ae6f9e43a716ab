// The JSON values a CNI config file holds once parsed: what cniconfig.ts edits and libcni.ts
// judges. A leaf, so the two need not import each other for it.

export type Json = null | boolean | number | string | Json[] | { [k: string]: Json };
export type JsonObject = { [k: string]: Json };
