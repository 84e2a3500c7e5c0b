// cert-manager for the end-to-end tests: its certificate controllers (SelfSigned and CA issuers)
// and its CA injector, run against the local control plane from cert-manager's published root
// module (its cmd/* binaries are not served by the Go module proxy). Built by tests/e2e/build.py
// into the binary cache; never committed.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	kscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	cmapi "github.com/cert-manager/cert-manager/pkg/api"
	"github.com/cert-manager/cert-manager/pkg/controller"
	"github.com/cert-manager/cert-manager/pkg/controller/cainjector"

	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

func main() {
	// A dependency already registers -kubeconfig on the standard flag set.
	kubeconfig := flag.String("cluster-kubeconfig", "", "kubeconfig of the control plane")
	namespace := flag.String("cluster-resource-namespace", "cert-manager", "namespace for ClusterIssuer secrets")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctrl.SetLogger(klog.NewKlogr())
	if err := run(ctx, *kubeconfig, *namespace); err != nil {
		fmt.Fprintln(os.Stderr, "cert-manager:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, kubeconfig, namespace string) error {
	factory, err := controller.NewContextFactory(ctx, controller.ContextOptions{
		Kubeconfig:         kubeconfig,
		KubernetesAPIQPS:   50,
		KubernetesAPIBurst: 100,
		IssuerOptions:      controller.IssuerOptions{ClusterResourceNamespace: namespace},
	})
	if err != nil {
		return err
	}
	for name, construct := range controller.Known() {
		c, err := construct(factory)
		if err != nil {
			return fmt.Errorf("controller %s: %w", name, err)
		}
		go func() {
			if err := c.Run(2, ctx); err != nil {
				klog.ErrorS(err, "controller stopped", "controller", name)
			}
		}()
	}
	// Nothing moves until the shared informer factories are started: build one more context from
	// the factory after the controllers and start its factories.
	shared, err := factory.Build("informers")
	if err != nil {
		return err
	}
	shared.KubeSharedInformerFactory.Start(ctx.Done())
	shared.SharedInformerFactory.Start(ctx.Done())

	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	config.UserAgent = "cert-manager-cainjector" // the field manager of its server-side applies
	scheme := runtime.NewScheme()
	utilruntime.Must(kscheme.AddToScheme(scheme))
	utilruntime.Must(cmapi.AddToScheme(scheme))
	manager, err := ctrl.NewManager(config, ctrl.Options{
		Scheme:  scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		Client:  client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
	})
	if err != nil {
		return err
	}
	err = cainjector.RegisterAllInjectors(ctx, manager, cainjector.SetupOptions{
		EnableCertificatesDataSource: true,
		EnabledReconcilersFor: map[string]bool{
			"validatingwebhookconfiguration": true,
			"mutatingwebhookconfiguration":   true,
		},
	})
	if err != nil {
		return err
	}
	return manager.Start(ctx)
}
