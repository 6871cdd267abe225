// ESLint's recommended rules for the page (browser ES modules) and its worker (an ES module worker).
// Text reaches the DOM through textContent and created elements only, never through HTML strings.
import js from "@eslint/js";
import globals from "globals";

const noHtmlStrings = ["innerHTML", "outerHTML", "insertAdjacentHTML"].map((property) => (
  { property, message: "set textContent or build elements; never parse HTML strings" }));

export default [
  js.configs.recommended,
  {
    files: ["**/*.js"],
    languageOptions: { ecmaVersion: 2022, sourceType: "module" },
    rules: {
      "no-restricted-properties": ["error", ...noHtmlStrings,
        { object: "document", property: "write", message: "build elements instead" }],
    },
  },
  {
    // The page's modules (main.js imports the others); the worker is the one module that is not a page's.
    files: ["src/**/*.js"],
    ignores: ["src/worker.js"],
    languageOptions: { globals: globals.browser },
  },
  {
    files: ["src/chart.js"],
    // Chart: the UMD build the page loads from /vendor/chart.umd.js (a deferred classic script).
    languageOptions: { globals: { Chart: "readonly" } },
  },
  {
    files: ["src/worker.js"],
    languageOptions: { globals: globals.worker },
  },
];
