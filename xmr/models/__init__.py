"""Building blocks shared by the methods: text encoders, image encoders, pooling operators, set heads."""
