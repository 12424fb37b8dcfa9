"""Evidence: what the drafter's attention alone misses, found in the text and mixed into its
scores (lexical anchors and their cascade, passage evidence and what lifts it, questions
about the whole document, the position prior)."""
