"""Paper reproductions on top of the planner, pure Python (no torch): public model sizes
(Cornstarch's, Optimus', OmniBal's), their partition comparisons, Optimus' published runs,
OmniBal's ablation at scale and Cornstarch's benchmark masks, with the tables
``tools/plan.py`` prints. Imports ``plan``; ``plan`` never imports this package."""
