"""Plan: the query and what must be kept (`Plan`), the token budget, and the segments
selection chooses among; everything decided before the drafter runs."""
