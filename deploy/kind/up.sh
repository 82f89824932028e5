#!/usr/bin/env bash
# From zero to pods with fake GPUs on kind.
#
#   deploy/kind/up.sh             create the kind cluster of deploy/kind/cluster.yaml (unless it
#                                 exists), build the image and load it into the nodes, install
#                                 the chart with fake GPUs (deploy/kind/values.yaml), wait for the
#                                 DaemonSet, run docs/examples/demo.yaml and print which GPU each
#                                 pod got
#   deploy/kind/up.sh down        delete the cluster
#   deploy/kind/up.sh chart-args  print, one per line, the release, chart and flags that decide
#                                 what helm installs (the tests render exactly these)
#
# Needs bash >= 3.2, docker (with BuildKit), kind >= v0.31 (v0.33.0 built the node image),
# kubectl and helm >= v3.19 on PATH. Environment: IMAGE_TAG (default: kind) names the image dra-gpu:<tag>.
# Run it again at will: every step reuses what is there (the image is rebuilt and the release
# upgraded, so a changed driver lands on the nodes).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
# values.yaml names the worker nodes, which kind names after the cluster: keep these in step.
cluster=dra-gpu
context=kind-$cluster
namespace=dra-gpu
release=dra-gpu
image_repository=dra-gpu
image_tag=${IMAGE_TAG:-kind}
demo_pods=(trainer notebook inference mixed pipeline cpu-only)

say() { printf '\n==> %s\n' "$*"; }
die() { printf 'up.sh: %s\n' "$*" >&2; exit 1; }

# What decides the objects helm installs (the tests render exactly these).
chart_args=(
    "$release" "$root/deploy/helm/dra-gpu"
    --namespace "$namespace"
    --values "$here/values.yaml"
    --set "image.repository=$image_repository"
    --set "image.tag=$image_tag"
)

need() {
    local tool
    for tool in docker kind kubectl helm; do
        command -v "$tool" >/dev/null || die "$tool is not on PATH (see docs/install.md)"
    done
    # Older kind applies both containerd patches of cluster.yaml, whatever the config version.
    local version
    version=$(kind version | sed -n 's/^kind v\([0-9]*\)\.\([0-9]*\)\..*/\1 \2/p')
    read -r major minor <<<"${version:-0 0}"
    if ((major == 0 && minor < 31)); then
        die "kind $(kind version | cut -d' ' -f2) is too old: v0.31 or later applies cluster.yaml's containerd patches by config version"
    fi
}

kubectl_() { kubectl --context "$context" "$@"; }

up() {
    need
    if kind get clusters 2>/dev/null | grep -qx "$cluster"; then
        say "kind cluster $cluster exists; reusing it"
    else
        say "creating kind cluster $cluster (Kubernetes 1.34, two workers)"
        kind create cluster --config "$here/cluster.yaml" --wait 2m
    fi

    local image=$image_repository:$image_tag
    say "building $image from deploy/Dockerfile"
    docker build --file "$root/deploy/Dockerfile" --tag "$image" "$root"
    say "loading $image into the nodes"
    kind load docker-image "$image" --name "$cluster"

    say "installing the chart with fake GPUs (deploy/kind/values.yaml)"
    # The DaemonSet mounts host paths: its namespace must allow privileged pods.
    kubectl_ create namespace "$namespace" --dry-run=client --output yaml | kubectl_ apply -f -
    kubectl_ label namespace "$namespace" --overwrite pod-security.kubernetes.io/enforce=privileged
    helm upgrade --install "${chart_args[@]}" --kube-context "$context" --wait --timeout 5m
    kubectl_ --namespace "$namespace" rollout status "daemonset/$release" --timeout 3m

    say "ResourceSlices the driver published"
    kubectl_ get resourceslices \
        --output custom-columns='NODE:.spec.nodeName,DRIVER:.spec.driver,DEVICES:.spec.devices[*].name'

    say "running docs/examples/demo.yaml"
    kubectl_ apply --namespace default --filename "$root/docs/examples/demo.yaml"
    local pod
    for pod in "${demo_pods[@]}"; do
        kubectl_ --namespace default wait --for=condition=Ready "pod/$pod" --timeout 3m
    done
    report
}

# Which devices each demo pod's claims were given, on which node, and the UUIDs the driver's
# CDI specs on that node give for them (each device names itself in DRA_GPU_<DEVICE>_UUID).
report() {
    say "what each pod got"
    printf '%-10s %-16s %-40s %s\n' POD NODE DEVICES "UUIDS (CDI)"
    local pod node claims claim uid devices visible
    for pod in "${demo_pods[@]}"; do
        node=$(kubectl_ --namespace default get pod "$pod" --output jsonpath='{.spec.nodeName}')
        claims=$(kubectl_ --namespace default get pod "$pod" \
            --output jsonpath='{.status.resourceClaimStatuses[*].resourceClaimName}')
        devices="" visible=""
        for claim in $claims; do
            devices+=$(kubectl_ --namespace default get resourceclaim "$claim" \
                --output jsonpath='{range .status.allocation.devices.results[*]}{.device}{" "}{end}')
            uid=$(kubectl_ --namespace default get resourceclaim "$claim" --output jsonpath='{.metadata.uid}')
            # kind nodes are containers: read the spec the driver wrote for this claim.
            visible+=$(docker exec "$node" cat "/var/run/cdi/k8s.gpu.nvidia.com-claim_$uid.json" 2>/dev/null |
                grep -o 'DRA_GPU_[A-Z0-9_]*_UUID=[^"]*' | cut -d= -f2 | tr '\n' ' ' || true)
        done
        devices=${devices% } visible=${visible% }
        printf '%-10s %-16s %-40s %s\n' "$pod" "$node" "${devices:--}" "${visible:-(no GPU)}"
    done
    printf '\nkubectl --context %s get pods,resourceclaims,resourceslices\n' "$context"
    printf 'deploy/kind/up.sh down   # delete the cluster\n'
}

case "${1:-up}" in
    up) up ;;
    down)
        command -v kind >/dev/null || die "kind is not on PATH"
        kind delete cluster --name "$cluster"
        ;;
    chart-args) printf '%s\n' "${chart_args[@]}" ;;
    report) report ;;
    *) die "unknown command $1 (up, down, chart-args, report)" ;;
esac
