"""One-off measurements: what each answered is in bench/README.md."""
