"""Operations made of many deployments: tune (switch + bench per layout on one box)."""
