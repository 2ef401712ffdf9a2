"""``python -m specfit.report --spec JSON --in name=path ... --out report=FOLDER`` (`specfit.stage`)."""

from specfit.report import main

if __name__ == "__main__":
    main()
