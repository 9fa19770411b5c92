"""How well Vigil detects, measured: the scenario suite, `vigil bench detect` against
the static rules, and the demo."""
