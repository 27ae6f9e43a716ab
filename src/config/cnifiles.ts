// The file-name rules of the CNI net dir, which the settings check flags against and the
// installer acts on: which names the runtime loads, the order it reads them in, our temp files'
// mark and our owned file's default name. A leaf (Node built-ins only), so src/config/ need not
// import the installer to check a flag.

/** What libcni reads from the net dir, as the runtime does. */
export const CONFIG_EXTENSIONS: readonly string[] = ['.conf', '.conflist', '.json'];

/**
 * Go's sort.Strings order, which libcni sorts the dir by: the names' UTF-8 bytes. Not JS's `<`
 * (UTF-16 code units: U+10000 before U+E000, the other way round in bytes), not locale. Every
 * place that orders file names uses this.
 */
export function byteOrder(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a), Buffer.from(b));
}

/** In the name of each of our temp files (atomicfile.ts), which no runtime reads as a CNI config. */
export const TEMP_MARKER = '.mesh-tmp-';

/** Our owned file's name unless --mesh-owned-cni-config-filename says otherwise. */
export const DEFAULT_OWNED_NAME = '02-mesh-cni.conflist';
