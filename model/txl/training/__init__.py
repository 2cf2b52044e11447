"""Training a byte-level model and evaluating it (the bundled model's recipe): `python -m txl.training.train`,
`python -m txl.training.evaluate`, `python -m txl.training.loss_curve`; `data` prepares the corpus."""
