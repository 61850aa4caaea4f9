"""bucketray: length-bucketed, epoch-seeded, resumable data pipeline and training harness on Ray."""
