"""Training of what ships in pflash/data: the scoring head, the segment probe, the drafter
calibration, the tap projection, and their corpora (`pflash head train`, `pflash probe train`,
`pflash calibrate`, `pflash projection train`)."""
