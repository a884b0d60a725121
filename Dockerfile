# syntax=docker/dockerfile:1
#
# One image for the gateway (`cohort serve`, the default), the interns'
# daemons (`cohort intern`, run by the Kubernetes provisioner in intern
# Pods) and the built-in agent (`cohort agent`). Third-party agents need
# Node.js: see docs/kubernetes.md for an image variant.
#
# No COHORT_* variable is set here: the gateway and the daemon read some of
# the same names (COHORT_LISTEN, COHORT_DATA_DIR), so each Pod sets its own.

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# Pure Go (the embedded SQLite is modernc.org/sqlite): a static binary that
# needs no libc in the final image.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/cohort ./cmd/cohort && \
    CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/cohort-intern ./cmd/cohort-intern

# CA roots and tzdata, no shell, no package manager; nonroot is 65532.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/cohort /cohort
# The local provisioner's interns run from it (cmd/cohort-intern).
COPY --from=build /out/cohort-intern /cohort-intern
USER 65532:65532
# The default data dir (./.cohort) lands in the nonroot user's home when
# the image runs without a volume, e.g. `docker run` to try it.
WORKDIR /home/nonroot
EXPOSE 8080
ENTRYPOINT ["/cohort"]
CMD ["serve"]
