"""Training of what ships in pflash/data: the scoring head, the segment probe, the drafter
calibration, and their corpora (`pflash head train`, `pflash probe train`, `pflash calibrate`)."""
