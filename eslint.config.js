// ESLint flat config: typescript-eslint's recommended rules on every .ts file.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['node_modules/', 'dist/', '.sandbox/', 'coverage/', '.scratch-*/'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      'no-restricted-properties': ['error', {
        object: 'process', property: 'env',
        message: 'Settings come from src/config/: pass the settings object down instead of reading process.env.',
      }],
    },
  },
  {
    // The only places allowed to read the environment: the settings builder, the plugin's CNI
    // protocol parser (CNI_* variables are its input), entry points and test/bench harnesses.
    files: ['src/config/**', 'cni-plugin/**', 'bin/**', 'scripts/**', 'test/**', 'src/cmd/**'],
    rules: { 'no-restricted-properties': 'off' },
  },
);
