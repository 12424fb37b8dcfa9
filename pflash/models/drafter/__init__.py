"""The drafter: scorer profiles, the early-exit scoring math, its forward pass, the scorer with
its sessions, the trained scoring head and the calibration."""
