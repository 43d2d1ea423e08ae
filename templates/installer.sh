# Installing into a venv with uv where it can, with pip where it cannot. Shared, as it is, by
# install.sh.j2 (which includes it) and `make setup` (which sources it): keep it free of Jinja syntax.
# uv resolves the same pins as pip, from the same places: the stock stack into a fresh venv took 28 s
# (empty cache) where pip took 90 s, on 2 busy cores (docs/install.json).

# fetch_uv VENV VERSION: uv VERSION (PyPI's static binary) into VENV/uv, fetched with the venv's pip.
fetch_uv() {
  [[ "$("$1/uv/bin/uv" --version 2>/dev/null)" == "uv $2 "* ]] \
    || "$1/bin/pip" install -q --disable-pip-version-check --upgrade --target "$1/uv" "uv==$2" >&2
}

# uv_flags_from_pip PIP: pip's own settings (its config files and PIP_* variables, as `PIP config list`
# reports them) as uv flags in UV_FLAGS. uv reads neither; without them it resolves from PyPI alone
# (where Linux torch is the CUDA build) and misses the wheels pip is pointed at. Returns 1, naming the
# setting, where one has no translation here: then pip installs, as configured.
uv_flags_from_pip() {
  local line section key value
  local -A setting=() rank=()
  while IFS= read -r line; do  # section.key='value'; an install reads [global], then [install], then PIP_*
    section=${line%%.*} key=${line#*.}; key=${key%%=*} value=${line#*=}; value=${value#\'}; value=${value%\'}
    case $section in global) section=1 ;; install) section=2 ;; :env:) section=3 ;; *) continue ;; esac
    if (( section > ${rank[$key]:-0} )); then setting[$key]=$value rank[$key]=$section; fi
  done < <("$1" config list --disable-pip-version-check 2>/dev/null)
  # pip considers every index and find-links location and takes the best version; uv's default stops
  # at the first index that has the package.
  UV_FLAGS=(--index-strategy unsafe-best-match)
  for key in "${!setting[@]}"; do
    value=${setting[$key]//\\n/ }  # a value of several lines, as pip's repr writes it
    case $key in
      index-url) UV_FLAGS+=(--index-url "$value") ;;
      extra-index-url) for line in $value; do UV_FLAGS+=(--extra-index-url "$line"); done ;;
      find-links) for line in $value; do UV_FLAGS+=(--find-links "$line"); done ;;
      constraint) for line in $value; do UV_FLAGS+=(--constraint "$line"); done ;;
      trusted-host) for line in $value; do UV_FLAGS+=(--allow-insecure-host "$line"); done ;;
      no-index) if [[ $value =~ ^(1|true|yes|on)$ ]]; then UV_FLAGS+=(--no-index); fi ;;
      cert) export SSL_CERT_FILE=$value ;;
      timeout | default-timeout) export UV_HTTP_TIMEOUT=${value%.*} ;;
      disable-pip-version-check | no-input | progress-bar | quiet | verbose | root-user-action | retries \
        | cache-dir | no-cache-dir | require-virtualenv | break-system-packages | config-file) ;;
      *) echo "pip's setting $key has no uv equivalent here: installing with pip" >&2; return 1 ;;
    esac
  done
}

# choose_installer VENV UV_VERSION: sets UV (and UV_FLAGS) where uv can be fetched and pip's settings
# translate; else leaves UV empty, says why, and brings the venv's pip up to date to install instead.
choose_installer() {
  UV=""
  if [ -z "$2" ]; then
    :  # no uv asked for
  elif ! fetch_uv "$1" "$2"; then
    echo "uv $2 could not be fetched: installing with pip instead" >&2
  elif uv_flags_from_pip "$1/bin/pip"; then
    UV=$1/uv/bin/uv
    echo "installing with uv $2"
    return 0
  fi
  echo "installing with pip"
  "$1/bin/pip" install -q --disable-pip-version-check --upgrade pip
}

# venv_install VENV ARGS...: `pip install -q ARGS` into VENV, by uv when choose_installer chose it. Where
# uv fails, pip installs instead, and does from then on: uv takes an index it cannot reach (PyPI's or
# PyTorch's, from a server that reaches packages only through its site's mirror) as fatal, where pip
# warns and takes what the reachable ones have.
venv_install() {
  local venv=$1 said; shift
  if [ -n "$UV" ]; then
    if said=$("$UV" pip install -q --python "$venv/bin/python" "${UV_FLAGS[@]}" "$@" 2>&1); then
      return 0
    fi
    said=$(printf '%s\n' "$said" | grep -v '^[[:space:]]*$' | tail -n 1)
    echo "uv failed (${said#"${said%%[![:space:]]*}"}): installing with pip, which goes on past an index it cannot reach" >&2
    UV=""
  fi
  "$venv/bin/pip" install -q --disable-pip-version-check "$@"
}
