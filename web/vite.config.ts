import { defineConfig } from "vite";

// The console is served by `cohort serve` at "/" from the embedded dist/.
export default defineConfig({
  build: { outDir: "dist", emptyOutDir: true, sourcemap: false },
  server: { proxy: { "/api": "http://127.0.0.1:8080" } },
});
