"""counterfactual: object-removal counterfactuals for image-text data (Kim et al., 2023) and
the tools around them. See ARCHITECTURE.md for the map of modules."""

__version__ = "0.2.0"
