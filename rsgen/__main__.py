# Absolute import: `accelerate launch rsgen ...` runs this file as a script, outside the package.
from rsgen.cli import main

if __name__ == "__main__":
    main()
