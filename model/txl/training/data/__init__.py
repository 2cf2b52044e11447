"""Training text: detokenizing the shared corpora and extracting documentation from Debian packages."""
