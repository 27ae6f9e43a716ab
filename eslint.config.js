// ESLint flat config: typescript-eslint's recommended rules on every .ts file, and the import
// directions between folders (see "Import zones" below and README, Layout).
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

// Import zones: pure planning never reaches for I/O, and each folder imports only what its job
// needs. An import the zone refuses, as a regex over the specifier as written;
// each names the direction and what to do instead.
const NO_SRC = {
  regex: '(^|/)src/',
  message:
    'cni-plugin/ imports nothing from src/: the plugin ships alone, Node built-ins only. ' +
    'Put what both bundles need in cni-plugin/shared/.',
};
const ONLY_SHARED = {
  regex: '(^|/)cni-plugin/(?!shared/|redirect/)',
  message:
    'src/ imports from cni-plugin/ only cni-plugin/shared/ and cni-plugin/redirect/ (the rule builder): ' +
    'move what the agent needs there (Node built-ins only).',
};
// The rule builder (constants, net parsing, spec, rules, the runner-generic iptables code) is
// what the agent's in-place repair shares with the plugin (docs/repair.md "Repair in place"): it
// stays pure, importing only its own files and cni-plugin/shared/, so src/ importing it pulls in
// nothing else.
const REDIRECT_SELF = {
  regex: '^(?!\\./[^/]+$|\\.\\./shared/[^/]+$)',
  message:
    'cni-plugin/redirect/ imports only its own files and cni-plugin/shared/: the agent imports it too, ' +
    'so it starts no process and reads no file (a runner is passed in).',
};
const SHARED_SELF = {
  regex: '^(?!node:|\\./[^/]+$)',
  message:
    'cni-plugin/shared/ imports only node: built-ins and its own files: ' +
    'both bundles load it, the plugin with nothing else.',
};
const ORCH_NOT_INSTALL = {
  regex: '(^\\.\\./|/src/)install/',
  message: 'src/orch/ does not import src/install/: the API client knows nothing of what the installer does with it.',
};
const CONFIG_NOT_ORCH = {
  regex: '(^\\.\\./|/src/)orch/',
  message: 'src/config/ does not import src/orch/: settings are built before any API client, from flags and env alone.',
};
const CONFIG_NOT_INSTALL = {
  regex: '(^\\.\\./|/src/)install/',
  message:
    'src/config/ does not import src/install/: the installer is built from the settings; the file-name ' +
    'rules both need live in src/config/cnifiles.ts.',
};
const AMBIENT_NOT_INSTALL_REPAIR = {
  regex: '(^(\\.\\./)+|/src/)(install|repair)/',
  message:
    'src/ambient/ does not import src/install/ or src/repair/: ambient mode talks to ztunnel and pod netns, ' +
    'beside the installer and repair; what they share goes in a module of its own that each imports.',
};
// Ambient mode is handed its own slice of the settings (AmbientArgs, cut by src/partargs.ts, as
// Istio builds its AmbientArgs), so it reads nothing of another part's: the whole Settings is refused.
const AMBIENT_OWN_ARGS = {
  regex: '(^\\.\\./|/src/)config/settings\\.ts$',
  importNames: ['Settings'],
  message:
    'src/ambient/ takes AmbientArgs (src/ambient/args.ts), which src/partargs.ts cuts from the settings, ' +
    "not the whole Settings: add what it needs to AmbientArgs, so it reads no other part's settings.",
};
// Every other part is handed its own settings too (src/partargs.ts cuts each part's slice, and
// src/agent.ts passes it, or the values a part reads): the whole Settings stops at that wiring.
const OWN_SLICE = {
  regex: '(^\\.{1,2}/|/src/)config/settings\\.ts$',
  importNames: ['Settings'],
  message:
    'this part takes the settings it reads (its slice, or the values), which src/partargs.ts cuts and ' +
    "src/agent.ts hands it, not the whole Settings: so it reads no other part's settings.",
};
// The node's readiness (src/node/) writes the agent's own Node from the agent's readiness: it is
// handed the readiness and the stop's uninstall decision, and reaches the API through src/orch/.
const NODE_SELF = {
  regex: '(^(\\.\\./)+|/src/)(install|repair|ambient|podnetns)/',
  message:
    'src/node/ does not import src/install/, src/repair/, src/ambient/ or src/podnetns/: it is handed the ' +
    "agent's readiness and the stop's uninstall decision (src/agent.ts wires them).",
};
// The pod-netns module (in-place repair and ambient mode both use it): the /proc scan and the
// nsenter runner on Node built-ins alone (and the agent's logger and its leaf modules
// src/concurrency.ts and src/filekind.ts), so both users import it and nothing more comes with it.
// Its run result is the rule applier's (cni-plugin/redirect/iptables.ts, pure itself), so one
// type serves the plugin's runner and the agent's.
const PODNETNS_SELF = {
  regex:
    '^(?!node:|\\./[^/]+$|\\.\\./monitoring/logging\\.ts$|\\.\\./(concurrency|filekind)\\.ts$|\\.\\./\\.\\./cni-plugin/redirect/iptables\\.ts$)',
  message:
    'src/podnetns/ imports only node: built-ins, its own files, ../monitoring/logging.ts, ../concurrency.ts, ' +
    '../filekind.ts and ../../cni-plugin/redirect/iptables.ts (the one run result type): ' +
    'repair and ambient both use it, so it does not import src/orch/, src/repair/ or src/install/ (its caller passes what it needs).',
};
// The bans match the path as written, so a detour they cannot see through (./../install/,
// ../orch/../install/, ..//install/, /./) is refused in every zone: write the path normalized.
const NORMALIZED = {
  regex: '//|.+/\\.(/|$)|(^|/)(?!\\.\\.(/|$))[^/]+/\\.\\.(/|$)',
  message: 'write the import path normalized (no ./.., x/.., /./ or //), so the import zones can check it.',
};
const MONITORING_NOT_CMD = {
  regex: '(^\\.\\./|/src/)cmd/',
  message: 'src/monitoring/ does not import src/cmd/: the CLI layer wires monitoring, not the other way.',
};

// One convention for private members: ECMAScript #private, which the runtime enforces,
// not TypeScript's `private`, which only the compiler sees. A `private constructor` (a class made
// only by its static factory) has no #-form and stays.
const PRIVATE_MEMBERS = [
  {
    selector: "PropertyDefinition[accessibility='private'], TSParameterProperty[accessibility='private']",
    message: 'private members are #private here (one convention): write #name, not private name.',
  },
  {
    selector: "MethodDefinition[accessibility='private'][kind!='constructor']",
    message: 'private members are #private here (one convention): write #name(), not private name().',
  },
];

/**
 * One zone: `files` may not import what `bans` match, statically (import, export ... from) or
 * with import(), whose path must then be a literal. A later config object replaces an earlier
 * one's options for the same rule, so each zone lists every ban that applies to its files.
 */
function zone(files, zoneBans) {
  const bans = [...zoneBans, NORMALIZED];
  const selector = (regex) => `ImportExpression > Literal.source[value=/${regex.replaceAll('/', '\\/')}/]`;
  return {
    files,
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: bans.map(({ regex, message, importNames }) => ({
            regex,
            message,
            ...(importNames && { importNames }),
          })),
        },
      ],
      'no-restricted-syntax': [
        'error',
        {
          selector: "ImportExpression[source.type!='Literal']",
          message: 'import() takes a literal path here, so the import zones can check it.',
        },
        ...bans.map(({ regex, message }) => ({ selector: selector(regex), message })),
        ...PRIVATE_MEMBERS,
      ],
    },
  };
}

export default tseslint.config(
  { ignores: ['node_modules/', 'dist/', '.sandbox/', 'coverage/', '.scratch-*/'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      'no-restricted-syntax': ['error', ...PRIVATE_MEMBERS],
      'no-restricted-properties': [
        'error',
        {
          object: 'process',
          property: 'env',
          message: 'Settings come from src/config/: pass the settings object down instead of reading process.env.',
        },
      ],
    },
  },
  {
    // The only places allowed to read the environment: the settings builder, the plugin's CNI
    // protocol parser (CNI_* variables are its input), entry points and test/bench harnesses.
    files: ['src/config/**', 'cni-plugin/**', 'bin/**', 'scripts/**', 'test/**', 'src/cmd/**'],
    rules: { 'no-restricted-properties': 'off' },
  },
  zone(['src/**/*.ts'], [ONLY_SHARED, OWN_SLICE]),
  // The wiring, where the whole Settings is cut into the parts' slices.
  zone(['src/agent.ts', 'src/partargs.ts'], [ONLY_SHARED]),
  zone(['src/orch/**/*.ts'], [ONLY_SHARED, ORCH_NOT_INSTALL, OWN_SLICE]),
  zone(['src/config/**/*.ts'], [ONLY_SHARED, CONFIG_NOT_ORCH, CONFIG_NOT_INSTALL]),
  zone(['src/monitoring/**/*.ts'], [ONLY_SHARED, MONITORING_NOT_CMD, OWN_SLICE]),
  zone(['src/ambient/**/*.ts'], [ONLY_SHARED, AMBIENT_NOT_INSTALL_REPAIR, AMBIENT_OWN_ARGS]),
  zone(['src/podnetns/**/*.ts'], [ONLY_SHARED, PODNETNS_SELF]),
  zone(['src/node/**/*.ts'], [ONLY_SHARED, NODE_SELF, OWN_SLICE]),
  zone(['cni-plugin/**/*.ts'], [NO_SRC]),
  zone(['cni-plugin/shared/**/*.ts'], [NO_SRC, SHARED_SELF]),
  zone(['cni-plugin/redirect/**/*.ts'], [NO_SRC, REDIRECT_SELF]),
);
