"""Pure planning core: bucket edges, epoch plans, collation, metric math, config. Imports no Ray and no torch."""
